from __future__ import annotations

import re
from pathlib import Path

from modelforge_protocol import environment
from modelforge_protocol.environment import Reader

ROOT = Path(__file__).resolve().parents[2]
#: Where the project reads its environment: product code, scripts, compose files, the LocalStack hook.
_SOURCES = ("agent", "worker", "functions", "tools", "protocol", "scripts", "localstack", "infra")
_NAME = re.compile(r"MODELFORGE_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")
_SUFFIXES = {".py", ".sh", ".yml", ".yaml", ".json", ".toml", ".env", ""}


def _source_files() -> list[Path]:
    found = [path for path in ROOT.glob("docker-compose*.yml")] + [ROOT / ".env.example"]
    for folder in _SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in _SUFFIXES and "node_modules" not in path.parts:
                found.append(path)
    return [path for path in found if path.is_file() and "__pycache__" not in path.parts]


def test_environment_variables_list_every_name_the_source_reads() -> None:
    names: set[str] = set()
    for path in _source_files():
        names.update(_NAME.findall(path.read_text(errors="replace")))
    missing = sorted(names - set(environment.VARIABLES))
    assert not missing, f"add these to modelforge_protocol.environment: {missing}"


def test_unknown_variables_lists_only_unknown_modelforge_names() -> None:
    env = {"MODELFORGE_AGENT_HOSTNAME": "a", "MODELFORGE_NOPE": "1", "PATH": "/bin", "MODELFORGE_A": ""}
    assert environment.unknown_variables(env) == ["MODELFORGE_A", "MODELFORGE_NOPE"]


def test_unknown_variable_warning_misspelled_name_suggests_the_known_one() -> None:
    assert environment.unknown_variable_warning("MODELFORGE_WORKER_DEVISE") == (
        "MODELFORGE_WORKER_DEVISE is not a ModelForge setting and is ignored (did you mean MODELFORGE_WORKER_DEVICE?)"
    )


def test_unknown_variable_warning_unrelated_name_suggests_nothing() -> None:
    assert environment.unknown_variable_warning("MODELFORGE_BANANA") == (
        "MODELFORGE_BANANA is not a ModelForge setting and is ignored"
    )


def test_unknown_variable_warnings_never_quote_a_value() -> None:
    warnings = environment.unknown_variable_warnings({"MODELFORGE_AGENT_ENROLMENT_TOKEN": "mfe.secret"})
    assert warnings == [
        (
            "MODELFORGE_AGENT_ENROLMENT_TOKEN",
            "MODELFORGE_AGENT_ENROLMENT_TOKEN is not a ModelForge setting and is ignored "
            "(did you mean MODELFORGE_AGENT_ENROLLMENT_TOKEN?)",
        )
    ]


def test_reader_text_strips_and_defaults_blank() -> None:
    reader = Reader({"A": "  x ", "B": "  "})
    assert (reader.text("A"), reader.text("B", "d"), reader.text("C", "d"), reader.optional("B")) == (
        "x",
        "d",
        "d",
        None,
    )


def test_reader_flag_accepts_the_usual_spellings_and_names_a_bad_one() -> None:
    reader = Reader({"A": "Yes", "B": "off", "C": "maybe"})
    assert (reader.flag("A", False), reader.flag("B", True), reader.flag("C", True), reader.flag("D", True)) == (
        True,
        False,
        True,
        True,
    )
    assert reader.problems == ["C must be true or false"]


def test_reader_number_out_of_range_or_not_a_number_is_a_problem() -> None:
    reader = Reader({"A": "5", "B": "nan", "C": "x", "D": "0.5"})
    assert reader.number("A", None, 1, 10) == 5.0
    reader.number("B", None, 1, 10)
    assert reader.number("C", 3.0, 1, 10, what="a number of seconds") == 3.0
    reader.number("D", None, 1, 10)
    assert reader.problems == [
        "B must be between 1 and 10",
        "C must be a number of seconds",
        "D must be between 1 and 10",
    ]


def test_reader_choice_normalises_and_lists_the_choices() -> None:
    reader = Reader({"A": "CPU", "B": "tpu"})
    assert reader.choice("A", "auto", ("auto", "cpu")) == "cpu"
    assert reader.choice("C", "auto", ("auto", "cpu")) == "auto"
    reader.choice("B", "auto", ("auto", "cpu"))
    assert reader.problems == ["B must be one of auto, cpu"]


def test_reader_integer_out_of_range_shows_the_number_and_bad_text_does_not() -> None:
    problems = ["earlier"]
    reader = Reader({"A": " 7 ", "B": "x", "C": "99", "E": " ", "F": ""}, problems)
    assert (reader.integer("A", 1, 1, 10), reader.integer("B", 2, 1, 10), reader.integer("D", 3, 1, 10)) == (7, 2, 3)
    assert (reader.integer("E", 4, 1, 10), reader.integer("F", 5, 1, 10)) == (4, 5)
    reader.integer("C", 1, 1, 10)
    assert problems == [
        "earlier",
        "B must be an integer",
        "E must be an integer",
        "C must be between 1 and 10 (got 99)",
    ]


def test_reader_choice_blank_is_refused_when_blank_is_not_unset() -> None:
    reader = Reader({"A": " ", "B": " "})
    assert reader.choice("A", "auto", ("auto", "cpu")) == "auto"
    reader.choice("B", "auto", ("auto", "cpu"), blank_is_unset=False)
    assert reader.problems == ["B must be one of auto, cpu"]
