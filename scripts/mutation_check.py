"""Mutation check of the stores' guards: no clause of a condition can be removed unnoticed.

Every clause of every condition expression and transaction condition check in
``functions/chalicelib/stores/*.py`` is mutated, one mutant at a time: removed (dropped from its
``&``, or the whole condition dropped when it is the only clause) and negated (``~clause``). For
each mutant the contract suite (tests/contract/, the DynamoDB half: the fakes do not run store
code) runs against a copy of ``functions/`` holding the mutant, so the working tree is never
changed. A mutant is killed when a test fails.

A clause is a comparison or ``exists()``/``does_not_exist()`` on a model attribute
(``WorkModel.epoch == item.epoch``), or a call of a store function that builds one
(``holds_credential(...)``); clauses in functions that query or scan (key conditions and
filters of reads) are not guards and are not mutated. A clause whose removal cannot change any
outcome is marked where it is written, on its line or on a comment line just above it::

    # mutation-equivalent: <why removing it changes nothing>

Its removal is listed as ``equivalent: <why>`` and not run; its negation still is.

Prints one line per mutant (``file:line  what changed  killed|survived``) and last
``N mutants, K killed, S survived``. Exits 0 only when no mutant survived (every mutant here is
a guard's). See docs/TESTING.md, "Store guards".
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORES = Path("functions/chalicelib/stores")
CONTRACT = Path("tests/contract")
#: The contract tests that exercise each store module's guards (a module's guard functions are
#: used by the stores that import them: the node store's credential check guards work writes).
TESTS_OF = {
    "work_store.py": ["test_work_contract.py"],
    "node_store.py": [
        "test_node_contract.py",
        "test_node_removal_contract.py",
        "test_work_contract.py",
        "test_channel_contract.py",
    ],
    "enrollment_store.py": ["test_enrollment_contract.py"],
    "control_store.py": ["test_control_contract.py"],
}
#: Reads: their conditions are key conditions and filters, not guards.
READ_CALLS = {"query", "scan", "count"}
EXISTENCE = {"exists", "does_not_exist"}
MARKER = re.compile(r"#\s*mutation-equivalent:\s*(?P<reason>.+?)\s*$")
OPERATORS = ("remove", "negate")


@dataclass(frozen=True)
class Mutant:
    path: Path  # relative to the repository root
    index: int  # the clause's position in the module's walk
    line: int
    operator: str
    clause: str
    equivalent: str | None  # the marker's reason (removal only)

    def describe(self) -> str:
        verb = "removed" if self.operator == "remove" else "negated"
        return f"{self.path}:{self.line}  {verb} `{self.clause}`"


def _is_model_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id.endswith("Model")


def _is_model_clause(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        return _is_model_attribute(node.left)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in EXISTENCE
        and _is_model_attribute(node.func.value)
    )


def _reads(function: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READ_CALLS
        for node in ast.walk(function)
    )


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            yield node


def _returns_value(function: ast.FunctionDef) -> bool:
    return any(isinstance(node, ast.Return) and node.value is not None for node in ast.walk(function))


def condition_functions(trees: dict[Path, ast.Module]) -> set[str]:
    """Module-level functions of the store modules that return a condition built of model clauses
    (not the ones that write with a condition: those return nothing)."""
    found = set()
    for tree in trees.values():
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not _returns_value(node) or _reads(node):
                continue
            if any(_is_model_clause(inner) for inner in ast.walk(node)):
                found.add(node.name)
    return found


def _guard_names(tree: ast.Module, builders: set[str]) -> set[str]:
    """The names this module calls those functions by (``heartbeat_after as online_since``)."""
    names = set(builders)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname for alias in node.names if alias.asname and alias.name in builders)
    return names


def clauses(tree: ast.Module, builders: set[str]) -> list[ast.expr]:
    """The guard clauses of ``tree``, in a fixed order (the same for every parse of the source)."""
    names = _guard_names(tree, builders)
    skipped = {id(node) for function in _functions(tree) if _reads(function) for node in ast.walk(function)}
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.expr):
            continue
        builder_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
        if _is_model_clause(node) or builder_call:
            found.append(node)
    return found


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


class _Replace(ast.NodeTransformer):
    """Replace one node (by identity) with another, or a statement with ``pass``."""

    def __init__(self, target: ast.AST, replacement: ast.AST) -> None:
        self.target, self.replacement = target, replacement

    def visit(self, node: ast.AST) -> ast.AST:
        if node is self.target:
            return self.replacement
        return super().visit(node)


def mutate(source: str, index: int, operator: str, builders: set[str]) -> str:
    """``source`` with its ``index``-th clause removed or negated."""
    tree = ast.parse(source)
    clause = clauses(tree, builders)[index]
    parent = _parents(tree)[id(clause)]
    target: ast.AST
    replacement: ast.AST
    if operator == "negate":
        target, replacement = clause, ast.UnaryOp(op=ast.Invert(), operand=clause)
    elif isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.BitAnd):
        target, replacement = parent, (parent.right if parent.left is clause else parent.left)
    elif isinstance(parent, ast.AugAssign) and isinstance(parent.op, ast.BitAnd):
        target, replacement = parent, ast.Pass()
    else:  # the whole condition: no condition at all
        target, replacement = clause, ast.Constant(value=None)
    mutated = _Replace(target, replacement).visit(tree)
    return ast.unparse(ast.fix_missing_locations(mutated))


def equivalence(lines: list[str], clause: ast.expr) -> str | None:
    """The reason a ``mutation-equivalent`` marker gives for ``clause``, if it has one."""
    first, last = clause.lineno, clause.end_lineno or clause.lineno
    candidates = list(range(first, last + 1))
    above = first - 1
    while above >= 1 and lines[above - 1].strip().startswith("#"):
        candidates.append(above)
        above -= 1
    for number in candidates:
        match = MARKER.search(lines[number - 1])
        if match:
            return match.group("reason")
    return None


def mutants(root: Path, operators: tuple[str, ...]) -> list[Mutant]:
    paths = sorted((root / STORES).glob("*.py"))
    trees = {path: ast.parse(path.read_text(), str(path)) for path in paths}
    builders = condition_functions(trees)
    found = []
    for path, tree in trees.items():
        lines = path.read_text().splitlines()
        for index, clause in enumerate(clauses(tree, builders)):
            reason = equivalence(lines, clause)
            text = ast.unparse(clause)
            for operator in operators:
                marked = reason if operator == "remove" else None
                found.append(Mutant(path.relative_to(root), index, clause.lineno, operator, text, marked))
    return sorted(
        found, key=lambda mutant: (str(mutant.path), mutant.line, mutant.index, OPERATORS.index(mutant.operator))
    )


def _pytest(root: Path, functions: Path, tests: list[str], backends: str | None, timeout: float) -> str:
    """Run the tests against the ``functions`` folder given: 'passed', 'failed' or 'timeout'."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", f"pythonpath={functions}"]
    command += ["-o", "addopts=", *tests]
    if backends:
        command += ["-k", backends]
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        result = subprocess.run(command, cwd=root, capture_output=True, timeout=timeout, env=environment)
    except subprocess.TimeoutExpired:
        return "timeout"
    if result.returncode == 5:  # nothing collected: a selection that tests nothing proves nothing
        raise SystemExit(f"error: no tests collected by: {' '.join(command)}")
    return "passed" if result.returncode == 0 else "failed"


def _tests_for(mutant: Mutant, override: list[str] | None) -> list[str]:
    if override:
        return override
    chosen = TESTS_OF.get(mutant.path.name)
    return [str(CONTRACT / name) for name in chosen] if chosen else [str(CONTRACT)]


def run_mutant(mutant: Mutant, args: argparse.Namespace, builders: set[str]) -> str:
    """'killed', 'survived' or 'killed (timeout)'."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as scratch:
        functions = Path(scratch) / "functions"
        shutil.copytree(ROOT / "functions", functions, ignore=shutil.ignore_patterns("__pycache__"))
        target = functions.parent / mutant.path
        target.write_text(mutate(target.read_text(), mutant.index, mutant.operator, builders))
        outcome = _pytest(ROOT, functions, _tests_for(mutant, args.tests), args.backends, args.timeout)
    return {"passed": "survived", "failed": "killed", "timeout": "killed (timeout)"}[outcome]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--operators", default=",".join(OPERATORS), help="remove,negate (default both)")
    parser.add_argument("--tests", nargs="+", help="run these test paths against every mutant instead")
    parser.add_argument(
        "--backends",
        default=None,
        help="pytest -k expression (default: 'dynamodb' for the contract suite, none with --tests)",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant (default 600)")
    parser.add_argument("--only", help="mutate only store modules whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    if args.backends is None:
        args.backends = None if args.tests else "dynamodb"
    operators = tuple(name for name in args.operators.split(",") if name)
    if not set(operators) <= set(OPERATORS):
        parser.error(f"--operators: choose from {','.join(OPERATORS)}")
    started = time.monotonic()
    trees = {path: ast.parse(path.read_text()) for path in sorted((ROOT / STORES).glob("*.py"))}
    builders = condition_functions(trees)
    found = [m for m in mutants(ROOT, operators) if not args.only or args.only in m.path.name]
    if args.list:
        for mutant in found:
            print(mutant.describe() + (f"  equivalent: {mutant.equivalent}" if mutant.equivalent else ""))
        return 0
    baseline = _pytest(ROOT, ROOT / "functions", args.tests or [str(CONTRACT)], args.backends, args.timeout)
    if baseline != "passed":
        print(f"error: the tests fail without any mutant ({baseline}); fix them first", file=sys.stderr)
        return 2
    to_run = [mutant for mutant in found if mutant.equivalent is None]
    killed = survived = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = iter(pool.map(lambda mutant: run_mutant(mutant, args, builders), to_run))
        for mutant in found:
            if mutant.equivalent is not None:
                print(f"{mutant.describe()}  equivalent: {mutant.equivalent}", flush=True)
                continue
            outcome = next(outcomes)
            killed += outcome.startswith("killed")
            survived += outcome == "survived"
            print(f"{mutant.describe()}  {outcome}", flush=True)
    print(f"({time.monotonic() - started:.0f} s; {len(found) - len(to_run)} equivalent, not run)", flush=True)
    print(f"{len(found)} mutants, {killed} killed, {survived} survived")
    return 0 if survived == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
