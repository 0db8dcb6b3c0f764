"""The docs document what the code offers: every `modelforge` command and its options in the
command table of docs/CLI.md, every option with a help text, and every environment variable the
code reads in a table of docs/CONFIGURATION.md (and no variable there that nothing reads)."""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from modelforge_cli.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
#: The command reference: a table row per command, and prose for options they share.
CLI_DOC = ROOT / "docs" / "CLI.md"
#: Every environment variable, in tables by component.
CONFIGURATION_DOC = ROOT / "docs" / "CONFIGURATION.md"
#: Where the shipped code lives (tests are scanned only to know what the README may mention).
CODE_DIRS = ("agent", "worker", "functions", "tools", "protocol")
SKIPPED_DIRS = {"vendor", "__pycache__", "build", "dist"}

#: Variables read by code that the docs deliberately do not document, and why.
UNDOCUMENTED: dict[str, str] = {}
#: Variables the configuration tables list that another program reads, not the project's code.
READ_BY_OTHERS: dict[str, str] = {
    "COMPOSE_PROJECT_NAME": "Docker Compose's own variable, which it reads from the node's .env",
}
#: Upper-case keys the scan finds that are not environment variables at all.
NOT_ENVIRONMENT: dict[str, str] = {
    name: "a key of a WSGI request's environ (the AWS emulator's request handling), not a process variable"
    for name in ("CONTENT_LENGTH", "HTTP_USER_AGENT", "HTTP_X_AMZ_TARGET", "PATH_INFO", "REQUEST_METHOD")
}

_ENV_NAME = re.compile(r"\bMODELFORGE_[A-Z0-9_]*[A-Z0-9]\b")
_UPPER = re.compile(r"[A-Z][A-Z0-9_]*[A-Z0-9]")
_ENV_RECEIVERS = {"environ", "env", "environment"}


# --- the command line ------------------------------------------------------------------------


def leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command (a parser without subcommands) and its words after `modelforge`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from leaf_commands(sub, (*path, name))
            return
    yield path, parser


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action for action in parser._actions if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


def _command_rows() -> list[str]:
    return [line for line in CLI_DOC.read_text().splitlines() if line.startswith("| `modelforge ")]


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_every_command_has_a_row_in_the_cli_doc_with_each_of_its_options() -> None:
    rows = _command_rows()
    prose = "\n".join(line for line in CLI_DOC.read_text().splitlines() if not line.startswith("|"))
    missing = []
    for path, parser in leaf_commands(build_parser()):
        command = " ".join(("modelforge", *path))
        row = next((row for row in rows if re.match(rf"\| `{re.escape(command)}(?=[ `])", row)), None)
        if row is None:
            missing.append(f"{command}: no row")
            continue
        for action in _options(parser):
            if not any(_mentions(row, option) or _mentions(prose, option) for option in action.option_strings):
                missing.append(f"{command}: {'/'.join(action.option_strings)} not in its row (nor the section's text)")
    assert not missing, "docs/CLI.md's command table lacks:\n" + "\n".join(missing)


def test_every_row_of_the_command_table_is_a_command() -> None:
    commands = {" ".join(path) for path, _ in leaf_commands(build_parser())}
    stale = []
    for row in _command_rows():
        words = []
        for word in row.removeprefix("| `modelforge ").split():
            if not re.fullmatch(r"[a-z][a-z-]*", word.strip("`")):
                break
            words.append(word.strip("`"))
            if word.endswith("`"):
                break
        if " ".join(words) not in commands:
            stale.append(row[:80])
    assert not stale, "rows for commands the CLI does not have:\n" + "\n".join(stale)


def test_every_option_and_command_has_a_help_text() -> None:
    undescribed = []
    for path, parser in leaf_commands(build_parser()):
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction) and not action.help:
                undescribed.append(f"modelforge {' '.join(path)}: {'/'.join(action.option_strings) or action.dest}")
    assert not undescribed, "options or arguments without help:\n" + "\n".join(undescribed)


def test_subcommands_have_a_help_line_in_their_parents_listing() -> None:
    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[str]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                described = {choice.dest for choice in action._choices_actions if choice.help}
                for name, sub in action.choices.items():
                    if name not in described:
                        yield " ".join(("modelforge", *path, name))
                    yield from walk(sub, (*path, name))

    assert not list(walk(build_parser(), ()))


def test_no_admin_command_takes_a_secret_as_an_argument() -> None:
    """The admin token comes from the environment only: an argument would show in `ps`."""
    for path, parser in leaf_commands(build_parser()):
        if path[0] in ("enrollments", "nodes", "work"):
            for action in _options(parser):
                assert not any(re.search(r"token|secret|credential", option) for option in action.option_strings), (
                    path,
                    action.option_strings,
                )


# --- environment variables -------------------------------------------------------------------


def _python_files(*folders: str) -> Iterator[Path]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if not SKIPPED_DIRS & set(path.relative_to(ROOT).parts) and ".egg-info" not in str(path):
                yield path


def _names_read(tree: ast.AST) -> set[str]:
    """MODELFORGE_* in any string, and any literal name read from an environment mapping
    (`os.environ[...]`, `os.environ.get(...)`, `os.getenv(...)`, `env.get(...)`)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names |= set(_ENV_NAME.findall(node.value))
        key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = node.func
            if isinstance(function, ast.Attribute) and function.attr in ("get", "pop", "setdefault"):
                receiver = function.value
                if (isinstance(receiver, ast.Attribute) and receiver.attr in _ENV_RECEIVERS) or (
                    isinstance(receiver, ast.Name) and receiver.id in _ENV_RECEIVERS
                ):
                    key = node.args[0].value
            elif (isinstance(function, ast.Attribute) and function.attr == "getenv") or (
                isinstance(function, ast.Name) and function.id == "getenv"
            ):
                key = node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            receiver = node.value
            if (isinstance(receiver, ast.Attribute) and receiver.attr in _ENV_RECEIVERS) or (
                isinstance(receiver, ast.Name) and receiver.id in _ENV_RECEIVERS
            ):
                key = node.slice.value
        if isinstance(key, str) and _UPPER.fullmatch(key):
            names.add(key)
    return names


def _names_in_scripts() -> set[str]:
    """Variables the shell scripts read with a default (`${NAME:-…}`), and every MODELFORGE_* they name."""
    names: set[str] = set()
    for path in sorted((ROOT / "scripts").iterdir()):
        if path.is_file():
            text = path.read_text(errors="replace")
            names |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):?[-=]", text))
            names |= set(_ENV_NAME.findall(text))
    return names


@cache
def variables_read_by_code() -> frozenset[str]:
    names: set[str] = set()
    for path in _python_files(*CODE_DIRS):
        names |= _names_read(ast.parse(path.read_text(), str(path)))
    return frozenset((names | _names_in_scripts()) - set(NOT_ENVIRONMENT))


def _backticked_names(text: str) -> set[str]:
    """Every UPPER_CASE name inside a `code span` (`NAME`, `NAME=value`)."""
    return {
        name
        for span in re.findall(r"`([^`]+)`", text)
        for name in re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b|\b[A-Z]{2,}\b", span)
    }


def _configuration_table_names() -> set[str]:
    """Every upper-case name in a code span on a table row of docs/CONFIGURATION.md."""
    names: set[str] = set()
    for line in CONFIGURATION_DOC.read_text().splitlines():
        if line.startswith("|"):
            names |= _backticked_names(line)
    return names


def test_the_scan_finds_the_variables_it_must() -> None:
    found = variables_read_by_code()
    for name in (
        "MODELFORGE_ADMIN_TOKEN",
        "MODELFORGE_AGENT_CONTROL_PLANE_URL",
        "MODELFORGE_WORKER_LISTEN",
        "MODELFORGE_API_URL",
        "MODELFORGE_WORK_TABLE",
        "AWS_ENDPOINT_URL",
    ):
        assert name in found, name
    # the shell scripts' own settings, read with a default
    assert "MODELFORGE_VENV" in found


def test_every_environment_variable_the_code_reads_is_in_a_configuration_table() -> None:
    documented = _configuration_table_names()
    missing = sorted(name for name in variables_read_by_code() - documented if name not in UNDOCUMENTED)
    assert not missing, (
        "read by the code but in no table of docs/CONFIGURATION.md (document them, or list them in UNDOCUMENTED "
        "with why):\n" + "\n".join(missing)
    )


def test_every_variable_in_the_configuration_tables_is_read_by_something() -> None:
    read = set(variables_read_by_code()) | set(READ_BY_OTHERS)
    for path in _python_files("tests", "bench"):
        read |= _names_read(ast.parse(path.read_text(), str(path)))
    listed = set()
    for line in CONFIGURATION_DOC.read_text().splitlines():
        if line.startswith("| `"):
            listed |= set(re.findall(r"`([A-Z][A-Z0-9_]*[A-Z0-9])`", line.split(" | ")[0]))  # the first cell
    assert not sorted(listed - read), "docs/CONFIGURATION.md rows for variables nothing reads"
    assert not set(UNDOCUMENTED) & listed, "a variable listed as undocumented is documented"
