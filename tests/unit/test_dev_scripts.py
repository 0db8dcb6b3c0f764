"""What the developer scripts promise: one pip version (one chalice accepts, so nothing moves it
back and forth), dev-up's flags for a stable admin token and a readable agent, and a documented
short-threshold example (docs/CONFIGURATION.md) that the control plane accepts."""

from __future__ import annotations

import importlib.metadata
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chalicelib.config.settings import SettingsError, load_settings
from modelforge_local_stack import provision
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _pip_range() -> SpecifierSet:
    script = (ROOT / "scripts" / "_venv.sh").read_text()
    (pinned,) = re.findall(r'^PIP_RANGE="pip([^"]+)"$', script, re.M)
    assert '"$PIP_RANGE"' in script and "--upgrade" not in script
    return SpecifierSet(pinned)


def test_the_pip_the_venv_script_installs_is_one_chalice_accepts() -> None:
    (chalice_pip,) = [
        Requirement(entry) for entry in importlib.metadata.requires("chalice") or [] if Requirement(entry).name == "pip"
    ]
    ours = _pip_range()
    candidates = [Version(f"{major}.{minor}") for major in range(9, 40) for minor in range(0, 10)]
    allowed = [version for version in candidates if version in ours]
    assert allowed, ours
    refused = [str(version) for version in allowed if version not in chalice_pip.specifier]
    assert not refused, f"_venv.sh installs pip{ours}, which chalice ({chalice_pip}) would move back: {refused}"
    assert Version(importlib.metadata.version("pip")) in ours, (
        "the installed pip is outside the range: rerun scripts/_venv.sh"
    )


def test_the_venv_script_installs_every_distribution_of_the_checkout_editable() -> None:
    """A pyproject.toml the script forgets would leave its package importable from nowhere (no
    sys.path insertion stands in for an install); the CLI comes with [aws], for --aws-sigv4."""
    script = (ROOT / "scripts" / "_venv.sh").read_text()
    installed = set(re.findall(r'-e "\$ROOT/?([^"\[$]*)(?:\[[^\]]*\]|\$\{EXTRAS:\+\[\$EXTRAS\]\})?"', script))
    projects = set()
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if not name.startswith((".", "_")) and name != "build"]
        if "pyproject.toml" in files:
            projects.add("" if Path(folder) == ROOT else str(Path(folder).relative_to(ROOT)))
    assert installed == projects, (installed, projects)
    assert '-e "$ROOT/tools/cli[aws]"' in script


def test_dev_up_keeps_its_token_and_data_in_dot_modelforge_and_passes_its_arguments_on() -> None:
    script = (ROOT / "scripts" / "dev-up").read_text()
    command = script[script.index('exec "$VENV/bin/modelforge" local up') :]
    words = shlex.split(command.replace("\\\n", " "))
    assert words[words.index("--admin-token-file") + 1] == ".modelforge/admin-token"
    assert words[words.index("--data-dir") + 1] == ".modelforge/control-plane"
    assert words[-1] == "$@", "the arguments must come last, so that they override dev-up's"
    assert 'MODELFORGE_AGENT_LOG_FORMAT="${MODELFORGE_AGENT_LOG_FORMAT:-text}"' in script


def _short_threshold_example() -> dict[str, str]:
    doc = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    start = doc.index("**Short thresholds**")
    block = doc[doc.index("```bash\n", start) + len("```bash\n") : doc.index("```", doc.index("```bash\n", start) + 7)]
    words = shlex.split(block.replace("\\\n", " "))
    assert words[-1] == "./scripts/dev-up", block
    return dict(word.split("=", 1) for word in words[:-1])


def test_the_documented_short_threshold_example_is_accepted_and_needs_its_heartbeat_interval() -> None:
    example = _short_threshold_example()
    assert "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS" in example
    base = {**provision.resource_names("modelforge"), "MODELFORGE_ADMIN_TOKEN": secrets.token_urlsafe(32)}
    settings = load_settings({**base, **example})
    assert settings.stale_after_seconds < 60 and settings.heartbeat_interval_seconds < settings.stale_after_seconds
    without = {name: value for name, value in example.items() if name != "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS"}
    with pytest.raises(SettingsError, match="must exceed MODELFORGE_HEARTBEAT_INTERVAL_SECONDS"):
        load_settings({**base, **without})


# --- dev-up and _venv.sh, run for real on a copy of the checkout's scripts and a stand-in .venv ---

#: What _venv.sh installs from (and hashes): the checkout's projects and the agent's constraints.
PROJECT_FILES = [
    "pyproject.toml",
    "agent/constraints.txt",
    *(
        f"{folder}/pyproject.toml"
        for folder in ("protocol", "agent", "worker", "functions", "tools/cli", "tools/local_stack")
    ),
]
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "${1-}" = "-m" ] && [ "${2-}" = "pip" ]; then echo "$*" >>"$PIP_LOG"; exit 0; fi
exec "$REAL_PYTHON" "$@"
"""
FAKE_MODELFORGE = """#!/usr/bin/env bash
printf '%s\\n' "$@" >"$ARGS_FILE"
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of dev-up, _venv.sh and the files they read, with a .venv whose python records pip
    calls (and runs nothing else of pip) and whose modelforge records its arguments."""
    root = tmp_path / "checkout"
    for name in ("scripts/dev-up", "scripts/_venv.sh", *PROJECT_FILES):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, root / name)
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("modelforge", FAKE_MODELFORGE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return root


def _dev_up(root: Path, *args: str, extras: str | None = None) -> tuple[list[str], list[str]]:
    """Run dev-up; the arguments it gave `modelforge` and the pip calls it made."""
    log, args_file = root / "pip.log", root / "args"
    log.write_text("")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "PIP_LOG": str(log),
        "ARGS_FILE": str(args_file),
        "REAL_PYTHON": sys.executable,
    }
    if extras is not None:
        env["MODELFORGE_EXTRAS"] = extras
    done = subprocess.run(["bash", str(root / "scripts" / "dev-up"), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return args_file.read_text().splitlines(), log.read_text().splitlines()


def _folders(words: list[str]) -> tuple[str, str]:
    return words[words.index("--with-worker") + 1], words[words.index("--with-cpu-agent") + 1]


@pytest.mark.parametrize(
    ("args", "worker", "agent"),
    [
        ((), ".modelforge/worker", ".modelforge/agent-state"),
        (("--data-dir", ".modelforge/control-plane"), ".modelforge/worker", ".modelforge/agent-state"),
        (("--port", "8001", "--data-dir", "other"), "other-worker", "other-agent-state"),
        (("--data-dir=stacks/second/",), "stacks/second-worker", "stacks/second-agent-state"),
    ],
    ids=["default", "default-named", "second-stack", "equals-form"],
)
def test_dev_up_worker_and_agent_folders_follow_the_data_dir(
    checkout: Path, args: tuple[str, ...], worker: str, agent: str
) -> None:
    words, _ = _dev_up(checkout, *args)
    assert _folders(words) == (worker, agent)
    assert words[len(words) - len(args) :] == list(args)  # the arguments still come last


def _installs(pip_calls: list[str]) -> list[str]:
    return [call for call in pip_calls if "--no-build-isolation" in call]


def test_dev_up_installs_only_when_what_it_installs_from_changed_and_never_the_test_tools(checkout: Path) -> None:
    _, first = _dev_up(checkout)
    (install,) = _installs(first)
    assert install.endswith(f"-e {checkout}"), install  # the developer's install without [test]
    assert _installs(_dev_up(checkout)[1]) == [] and _dev_up(checkout)[1] == []  # nothing changed: no pip at all
    constraints = checkout / "agent" / "constraints.txt"
    constraints.write_text(constraints.read_text() + "\n# changed\n")
    assert len(_installs(_dev_up(checkout)[1])) == 1
    assert _dev_up(checkout)[1] == []


def test_the_test_scripts_extra_installs_the_test_tools_once_and_dev_up_then_keeps_them(checkout: Path) -> None:
    _dev_up(checkout)
    (with_tests,) = _installs(_dev_up(checkout, extras="test")[1])
    assert with_tests.endswith(f"-e {checkout}[test]")
    assert _dev_up(checkout, extras="test")[1] == []
    assert _dev_up(checkout)[1] == []  # the test tools stay; dev-up does not reinstall without them
    for script in ("test", "lint", "mutation-check"):
        assert 'MODELFORGE_EXTRAS="${MODELFORGE_EXTRAS:-test}"' in (ROOT / "scripts" / script).read_text(), script


def test_the_local_stack_installs_no_server_mode_dependencies_of_other_aws_services() -> None:
    """moto's [server] extra brings cfn-lint, networkx, docker, ... (about 70 MB) for services the
    emulator does not serve; the dispatcher needs Flask and Flask-Cors only."""
    import tomllib

    project = tomllib.loads((ROOT / "tools" / "local_stack" / "pyproject.toml").read_text())
    requirements = [Requirement(entry) for entry in project["project"]["dependencies"]]
    (moto,) = [requirement for requirement in requirements if requirement.name == "moto"]
    assert moto.extras == {"dynamodb", "s3"}
    assert {"flask", "flask-cors"} <= {requirement.name for requirement in requirements}
    import moto.moto_server.werkzeug_app  # noqa: F401 - the dispatcher the emulator serves with imports
