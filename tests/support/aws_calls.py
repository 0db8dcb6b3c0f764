"""The AWS calls each deployed function can make, read from the source of functions/.

A name-level call graph over ``app.py`` and ``chalicelib/``: each top-level function and method
(nested functions, such as a transaction's ``build``, count as their enclosing one) links to the
functions it names: module functions, imported ones (at the top or inside a function: app.py's
routes import their services), ``module.function``, ``self.method``, and ``stores.<store>.<method>``
(the ``Stores`` of ``stores/dynamodb.py``, by field). Following the
links from a function's entry point gives every function it can reach (a superset: a name is
followed whether or not that branch runs). In those, an AWS call is a call on a PynamoDB model class
(``NodeModel.get``), its index (``NodeModel.by_liveness.query``), a model instance made in the same
function (``node = NodeModel(id); node.update(...)``), a ``transaction`` (``TransactWrite``), or an
S3 client (``self._s3``, ``s3``); ``aws_permissions`` gives its IAM action. A call on one of those
receivers that the table does not know is reported, so a new kind of call cannot go unnoticed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from chalicelib.stores import aws_permissions, models
from pynamodb.attributes import Attribute
from pynamodb.indexes import Index

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"
#: Each deployed function's entry points in app.py (the API handler: every route and middleware;
#: Chalice deploys each WebSocket handler as a function of its own, named as below).
ENTRY_POINTS = {
    "LivenessSweep": ("liveness_sweep",),
    "StateLog": ("state_log",),
    "WebsocketConnect": ("channel_connect",),
    "WebsocketMessage": ("channel_message",),
    "WebsocketDisconnect": ("channel_disconnect",),
}
_NOT_API = {
    "liveness_sweep",
    "state_log",
    "_instance_or_refuse",
    "channel_connect",
    "channel_message",
    "channel_disconnect",
}
_S3_RECEIVERS = {"s3", "_s3"}
#: The API Gateway management API client of the channel store.
_CHANNEL_RECEIVERS = {"management"}

Key = tuple[str, str]  # (module, "function" or "Class.method")


@dataclass
class Found:
    actions: set[str] = field(default_factory=set)
    #: calls on an AWS receiver that the table does not know: "module:function: receiver.method"
    unknown: list[str] = field(default_factory=list)


@dataclass
class _Module:
    name: str
    tree: ast.Module
    #: local name -> module it names (``from . import work``)
    modules: dict[str, str] = field(default_factory=dict)
    #: local name -> (module, function) it names (``from .x import f as g``)
    names: dict[str, Key] = field(default_factory=dict)
    #: "f" or "Class.m" -> its definition
    defs: dict[str, ast.AST] = field(default_factory=dict)


def _module_name(path: Path) -> str:
    relative = path.relative_to(FUNCTIONS).with_suffix("")
    return ".".join(relative.parts)


@cache
def _modules() -> dict[str, _Module]:
    found: dict[str, _Module] = {}
    for path in [FUNCTIONS / "app.py", *sorted((FUNCTIONS / "chalicelib").rglob("*.py"))]:
        module = _Module(_module_name(path), ast.parse(path.read_text(), str(path)))
        # imports anywhere in the module: app.py imports each route's services inside the route
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                for alias in node.names:
                    local = alias.asname or alias.name
                    if (FUNCTIONS / base.replace(".", "/") / f"{alias.name}.py").is_file():
                        module.modules[local] = f"{base}.{alias.name}"  # from chalicelib.layer import module
                    else:
                        module.names[local] = (base, alias.name)
        for node in module.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                module.defs[node.name] = node
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        module.defs[f"{node.name}.{item.name}"] = item
        found[module.name] = module
    return found


@cache
def _store_classes() -> dict[str, Key]:
    """``Stores`` field -> (module, class) of its DynamoDB store (stores/dynamodb.py)."""
    module = _modules()["chalicelib.stores.dynamodb"]
    found: dict[str, Key] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Stores":
            for keyword in node.keywords:
                if isinstance(keyword.value, ast.Call) and isinstance(keyword.value.func, ast.Name):
                    assert keyword.arg is not None
                    found[keyword.arg] = module.names[keyword.value.func.id]
    return found


def _model(name: str) -> type | None:
    candidate = getattr(models, name, None)
    return candidate if isinstance(candidate, type) and issubclass(candidate, models.Model) else None


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None when it does not start with a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _links(module: _Module, key: str, definition: ast.AST) -> set[Key]:
    """The functions ``definition`` names."""
    links: set[Key] = set()
    owner = key.split(".")[0] if "." in key else None
    stores = _store_classes()
    for node in ast.walk(definition):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in module.defs:
                links.add((module.name, node.id))
            elif node.id in module.names:
                links.add(module.names[node.id])
        elif isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain is None:
                continue
            if len(chain) == 2 and chain[0] in module.modules:
                links.add((module.modules[chain[0]], chain[1]))
            elif len(chain) == 2 and chain[0] == "self" and owner is not None:
                links.add((module.name, f"{owner}.{chain[1]}"))
            elif len(chain) >= 3 and chain[-3] == "stores" and chain[-2] in stores:
                store_module, store_class = stores[chain[-2]]
                links.add((store_module, f"{store_class}.{chain[-1]}"))
    return links


def _model_instances(definition: ast.AST) -> set[str]:
    """Names bound to ``SomeModel(...)`` in the definition."""
    bound: set[str] = set()
    for node in ast.walk(definition):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and _model(node.value.func.id) is not None
        ):
            bound.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return bound


def _calls(module: _Module, key: str, definition: ast.AST, found: Found) -> None:
    """The AWS calls made directly in ``definition``."""
    instances = _model_instances(definition)
    where = f"{module.name}:{key}"
    for node in ast.walk(definition):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        chain = _chain(node.func)
        if chain is None:
            continue
        *receiver, method = chain
        if receiver and receiver[-1] in _S3_RECEIVERS and method == "generate_presigned_url":
            _presigned_url(node, where, found)
            continue
        table = _call_table(receiver, method, instances)
        if table is None:
            continue
        if method in table:
            found.actions.add(table[method])
        else:
            found.unknown.append(f"{where}: {'.'.join(receiver)}.{method}")


def _presigned_url(node: ast.Call, where: str, found: Found) -> None:
    """The action a ``generate_presigned_url(operation, ...)`` call grants."""
    operation = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
    if operation in aws_permissions.S3_PRESIGNED:
        found.actions.add(aws_permissions.S3_PRESIGNED[operation])
    else:
        found.unknown.append(f"{where}: presigned {operation!r}")


def _call_table(receiver: list[str], method: str, instances: set[str]) -> dict[str, str] | None:
    """The permission table of calls on ``receiver`` (a transaction, an S3 client, a PynamoDB
    model, one of its instances or one of its indexes), or None where the call is no AWS call."""
    if len(receiver) == 1 and receiver[0] == "transaction":
        return aws_permissions.TRANSACTION_CALLS
    if receiver and receiver[-1] in _S3_RECEIVERS:
        return aws_permissions.S3_CALLS
    if len(receiver) == 1 and receiver[0] in _CHANNEL_RECEIVERS:
        return aws_permissions.CHANNEL_CALLS
    if len(receiver) == 1 and (_model(receiver[0]) is not None or receiver[0] in instances):
        model = _model(receiver[0])
        if model is not None and isinstance(getattr(model, method, None), Attribute):
            return None  # NodeModel.liveness == ... is a condition, not a call
        return aws_permissions.PYNAMODB_CALLS
    if len(receiver) == 2 and (model := _model(receiver[0])) is not None:
        if not isinstance(getattr(model, receiver[1], None), Index):
            return None  # NodeModel.node_id.exists(): a condition on an attribute
        return aws_permissions.PYNAMODB_CALLS
    return None


def api_entry_points() -> tuple[str, ...]:
    """Every function of app.py that serves HTTP: the routes, their helpers and the middleware."""
    return tuple(sorted(name for name in _modules()["app"].defs if "." not in name and name not in _NOT_API))


def reachable(entry_points: tuple[str, ...]) -> set[Key]:
    modules = _modules()
    seen: set[Key] = set()
    todo = [("app", name) for name in entry_points]
    while todo:
        key = todo.pop()
        if key in seen or key[0] not in modules or key[1] not in modules[key[0]].defs:
            continue
        seen.add(key)
        module = modules[key[0]]
        todo.extend(_links(module, key[1], module.defs[key[1]]))
    return seen


def calls_of(function: str) -> Found:
    """The IAM actions of the AWS calls the deployed ``function`` can reach."""
    entry_points = api_entry_points() if function == "APIHandler" else ENTRY_POINTS[function]
    found = Found()
    modules = _modules()
    for module_name, key in sorted(reachable(entry_points)):
        module = modules[module_name]
        _calls(module, key, module.defs[key], found)
    return found


def every_call() -> Found:
    """The AWS calls anywhere in functions/ (every definition, reachable or not)."""
    found = Found()
    for module in _modules().values():
        for key, definition in module.defs.items():
            _calls(module, key, definition, found)
    return found
