"""The agent's modules keep to themselves: no private name imported from another module, no
private member of another object touched in the work loop, and no module over 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import modelforge_node_agent

PACKAGE = Path(modelforge_node_agent.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_LINES = 600


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_agent_modules_import_no_private_name() -> None:
    crossing = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} imports {alias.name}"
        for path in MODULES
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert crossing == []


def test_agent_work_loop_touches_no_private_member_of_another_object() -> None:
    reaching = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}"
        for path in sorted((PACKAGE / "work").glob("*.py"))
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert reaching == []


def test_agent_modules_are_at_most_600_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in MODULES
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
