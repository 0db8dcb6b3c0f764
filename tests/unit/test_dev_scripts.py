"""What the developer scripts promise: one pip version (one chalice accepts, so nothing moves it
back and forth), dev-up's flags for a stable admin token and a readable agent, and a documented
short-threshold example (docs/CONFIGURATION.md) that the control plane accepts."""

from __future__ import annotations

import importlib.metadata
import os
import re
import secrets
import shlex
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
    installed = set(re.findall(r'-e "\$ROOT/?([^"\[]*)(?:\[[^\]]*\])?"', script))
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
    assert words[words.index("--with-cpu-agent") + 1] == ".modelforge/agent-state"
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
