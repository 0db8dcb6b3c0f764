"""No log call in product code passes a reserved ``LogRecord`` attribute in ``extra``.

``logging`` raises ``KeyError("Attempt to overwrite 'name' in LogRecord")`` for such a key, at the
moment the line is logged: the worker once crashed on every unknown ``MODELFORGE_WORKER_*``
variable that way. The scan reads ``extra={...}`` literals and, for ``extra=<name>``, the dict
literals assigned to that name and the keys set on it (``fields["key"] = ...``) in the same
function.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agent", "worker", "functions", "tools", "protocol")
#: What ``Logger.makeRecord`` refuses in ``extra``.
RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log"})


def _literal_keys(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        return {key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {keyword.arg for keyword in node.keywords if keyword.arg is not None}
    return set()


def _keys_given_to(name: str, scope: ast.AST) -> set[str]:
    """Keys of the dict literals assigned to ``name`` in ``scope``, and keys set on it there."""
    keys: set[str] = set()
    for node in ast.walk(scope):
        targets: list[ast.expr] = []
        value: ast.AST | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and target.id == name and value is not None:
                keys |= _literal_keys(value)
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id == name
                and isinstance(target.slice, ast.Constant)
                and isinstance(target.slice.value, str)
            ):
                keys.add(target.slice.value)
    return keys


def reserved_extra_keys(source: str, filename: str = "<source>") -> list[str]:
    """``file:line key`` for each reserved key a log call in ``source`` passes in ``extra``."""
    tree = ast.parse(source, filename)
    found: list[str] = []
    scopes = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in [tree, *scopes]:
        for node in ast.walk(scope):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in _LOG_METHODS:
                continue
            for keyword in node.keywords:
                if keyword.arg != "extra":
                    continue
                keys = _literal_keys(keyword.value)
                if isinstance(keyword.value, ast.Name):
                    keys |= _keys_given_to(keyword.value.id, scope)
                found.extend(f"{filename}:{node.lineno} {key}" for key in sorted(keys & RESERVED))
    return sorted(set(found))


def _product_files() -> list[Path]:
    return [
        path
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        if ".venv" not in path.parts and "node_modules" not in path.parts
    ]


def test_log_calls_in_product_code_pass_no_reserved_log_record_attribute_in_extra() -> None:
    files = _product_files()
    assert len(files) > 50  # the scan found the product code
    found = [hit for path in files for hit in reserved_extra_keys(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, f"rename these extra keys (reserved LogRecord attributes): {found}"


def test_reserved_extra_keys_literal_reserved_key_is_found() -> None:
    source = 'log.warning("x", extra={"event": "e", "name": "n"})\n'
    assert reserved_extra_keys(source) == ["<source>:1 name"]


def test_reserved_extra_keys_key_set_on_a_named_dict_is_found() -> None:
    source = (
        "def f(log):\n"
        '    fields: dict = {"event": "e"}\n'
        '    fields["module"] = "m"\n'
        "    log.info('x', extra=fields)\n"
    )
    assert reserved_extra_keys(source) == ["<source>:4 module"]


def test_reserved_extra_keys_ordinary_keys_are_not_found() -> None:
    source = 'log.info("x", extra={"event": "e", "variable": "v"})\nlog.info("y", extra=dict(path="p"))\n'
    assert reserved_extra_keys(source) == []
