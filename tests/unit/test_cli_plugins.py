"""`modelforge` takes commands from other distributions (the ``modelforge.commands`` entry-point
group, modelforge_cli/plugins.py): the local stack's only load when one of them runs, and without
the local stack its words answer how to install it."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import modelforge_cli
import pytest
from modelforge_cli import cli, plugins

#: what `modelforge nodes list` may load of the local stack: the entry point's light module only
_PROBE = """
import json, sys
from modelforge_cli import cli
code = cli.main(["nodes", "list", "--api-url", "http://127.0.0.1:9"])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_plugins_installed_in_the_full_install_names_the_local_stack_commands() -> None:
    assert {name for name, _ in plugins.installed()} >= set(plugins.LOCAL_STACK_COMMANDS)


def test_cli_nodes_list_in_the_full_install_imports_no_emulator_nor_any_local_stack_module() -> None:
    env = {**os.environ, "MODELFORGE_ADMIN_TOKEN": "t" * 43}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["code"] == 2 and "cannot reach http://127.0.0.1:9" in done.stderr  # it ran to its end
    modules = set(seen["modules"])
    local_stack = {name for name in modules if name.startswith("modelforge_local_stack")}
    assert local_stack == {"modelforge_local_stack", "modelforge_local_stack.commands"}
    heavy = ("moto", "werkzeug", "chalice", "chalicelib", "boto3", "botocore", "pynamodb")
    assert not {name for name in modules if name.split(".")[0] in heavy}


def test_build_parser_expands_only_the_plugin_command_it_is_told() -> None:
    listed = _subcommands(cli.build_parser(expand=("log",)))
    assert _subcommands(listed["local"]) == {} and _subcommands(listed["infra"]) == {}
    assert set(_subcommands(listed["log"])) == {"replay"}
    assert set(_subcommands(_subcommands(cli.build_parser())["local"])) == {"up"}


@pytest.fixture()
def no_local_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing() -> Iterator[tuple[str, plugins.Loader]]:
        return iter(())

    monkeypatch.setattr(plugins, "installed", nothing)


@pytest.mark.parametrize("argv", [["local", "up", "--help"], ["log", "replay"], ["infra", "package", "out"]])
def test_cli_without_the_local_stack_answers_its_commands_with_how_to_install_it_and_exit_2(
    no_local_stack: None, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == cli.EXIT_CONFIG
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"modelforge: `{argv[0]}` comes with the local stack, which is not installed: " + (
        "pip install modelforge-local-stack\n"
    )


def test_cli_help_without_the_local_stack_lists_its_commands_as_needing_it(
    no_local_stack: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "run the control plane on this machine (needs modelforge-local-stack)" in out
    assert "nodes" in out


def test_cli_runs_a_plugin_command_of_another_distribution_listed_after_the_builtin_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[argparse.Namespace] = []
    extra = plugins.Command(
        help="an extra command",
        add_arguments=lambda parser: parser.add_argument("--flag", action="store_true", help="a flag"),
        run=lambda args: ran.append(args) or 7,
    )
    real = list(plugins.installed())
    monkeypatch.setattr(plugins, "installed", lambda: iter([*real, ("extra", lambda: extra)]))
    assert list(_subcommands(cli.build_parser()))[-1] == "extra"
    assert cli.main(["extra", "--flag"]) == 7
    assert ran[0].flag is True


def test_admin_cli_modules_import_nothing_of_the_local_stack_nor_the_control_plane() -> None:
    """What modelforge-cli's wheel declares (requests and the protocol; botocore with [aws]) is all
    its modules import, besides the standard library."""
    # modelforge-protocol ships two packages: modelforge_protocol and modelforge_logging
    allowed = {"requests", "modelforge_protocol", "modelforge_logging", "modelforge_cli", "botocore"}
    outside = []
    for path in sorted(Path(modelforge_cli.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in allowed and top not in sys.stdlib_module_names:
                    outside.append(f"{path.name}: {name}")
    assert outside == []
