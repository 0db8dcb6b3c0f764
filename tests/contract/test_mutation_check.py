"""What scripts/mutation_check.py takes for a guard clause, and what each mutant of it is."""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "scripts" / "mutation_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


TOOL = _tool()

SOURCE = textwrap.dedent(
    """
    from chalicelib.stores.node_store import holds as also_holds


    def holds(sha):
        return (NodeModel.credential_sha256 == sha) & (NodeModel.credential_state == "active")


    def still(item, check):
        condition = (WorkModel.status == "leased") & (WorkModel.epoch == item.epoch)
        if check:
            condition &= WorkModel.lease_holder == check
        return condition


    def write(item):
        transaction.update(item, condition=WorkModel.status == "queued")
        # mutation-equivalent: a new id never exists
        transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())
        transaction.condition_check(NodeModel, "n", condition=also_holds("x") & (NodeModel.liveness == "online"))


    def listing(status):
        return WorkModel.scan(WorkModel.status == status)
    """
)


def _clauses() -> list[str]:
    tree = ast.parse(SOURCE)
    return [ast.unparse(clause) for clause in TOOL.clauses(tree, TOOL.condition_functions({Path("x"): tree}))]


def _mutant(clause: str, operator: str) -> str:
    tree = ast.parse(SOURCE)
    index = _clauses().index(clause)
    builders = TOOL.condition_functions({Path("x"): tree})
    return TOOL.mutate(SOURCE, index, operator, builders)


def test_mutation_check_model_comparisons_and_builder_calls_are_clauses_read_filters_are_not() -> None:
    assert sorted(_clauses()) == sorted(
        [
            "NodeModel.credential_sha256 == sha",
            "NodeModel.credential_state == 'active'",
            "WorkModel.status == 'leased'",
            "WorkModel.epoch == item.epoch",
            "WorkModel.lease_holder == check",
            "WorkModel.status == 'queued'",
            "OutboxModel.event_id.does_not_exist()",
            "also_holds('x')",  # the builder, imported under another name
            "NodeModel.liveness == 'online'",
        ]
    )


def test_mutation_check_removed_conjunct_leaves_the_other() -> None:
    mutated = _mutant("WorkModel.epoch == item.epoch", "remove")
    assert "condition = WorkModel.status == 'leased'\n" in mutated


def test_mutation_check_removed_augmented_conjunct_becomes_pass() -> None:
    mutated = _mutant("WorkModel.lease_holder == check", "remove")
    assert "lease_holder" not in mutated
    assert "if check:\n        pass" in mutated


def test_mutation_check_removed_only_clause_leaves_no_condition() -> None:
    assert "transaction.update(item, condition=None)" in _mutant("WorkModel.status == 'queued'", "remove")


def test_mutation_check_negated_clause_is_inverted_in_place() -> None:
    mutated = _mutant("NodeModel.liveness == 'online'", "negate")
    assert "condition=also_holds('x') & ~(NodeModel.liveness == 'online')" in mutated


def test_mutation_check_marker_above_clause_names_its_reason() -> None:
    tree, lines = ast.parse(SOURCE), SOURCE.splitlines()
    reasons = {ast.unparse(clause): TOOL.equivalence(lines, clause) for clause in TOOL.clauses(tree, {"holds"})}
    assert reasons["OutboxModel.event_id.does_not_exist()"] == "a new id never exists"
    assert reasons["WorkModel.status == 'queued'"] is None


def test_mutation_check_store_modules_every_guarded_write_has_mutants() -> None:
    """The real store modules: each store's guards are found (a refactor that hid them from the
    tool would make the check pass vacuously)."""
    found = TOOL.mutants(ROOT, ("remove",))
    by_module = {mutant.path.name for mutant in found}
    assert {"work_store.py", "node_store.py", "enrollment_store.py", "control_store.py"} <= by_module
    assert len(found) >= 50
