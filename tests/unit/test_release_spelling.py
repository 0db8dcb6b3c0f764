"""One spelling of the release wherever a person reads it (issue 21, "Words"): SemVer
(``IMAGE_TAG_VERSION``, ``1.3.0-rc.1``) in every program's --version, what the agent and the
worker report, the control plane's release, the OpenAPI document, the release commands and the
docs; PEP 440 (``RELEASE``, ``1.3.0rc1``) only in package metadata and where DEPLOY.md says so."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from modelforge_cli.cli import main
from modelforge_protocol import versions
from modelforge_protocol.versions import IMAGE_TAG_VERSION, RELEASE

REPO = Path(__file__).resolve().parents[2]
#: What a person reads: the docs, the node's settings and the files that build and start images.
READ_BY_PEOPLE = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "agent" / "README.md",
    REPO / "worker" / "README.md",
    REPO / ".env.example",
    *sorted(REPO.glob("docker-compose*.yml")),
    REPO / "agent" / "Dockerfile",
    REPO / "worker" / "Dockerfile",
]
#: The one section that names the PEP 440 form, to say where it is required.
EXPLAINED_IN = (REPO / "docs" / "DEPLOY.md", "## Release numbers")
PRERELEASE = re.compile(r"\b\d+\.\d+\.\d+-(?:rc|alpha|beta)\.\d+\b")


def test_every_version_a_program_reports_is_the_image_tag_spelling() -> None:
    from modelforge_runtime_worker import WORKER_VERSION

    assert versions.AGENT_VERSION == versions.CONTROL_PLANE_RELEASE == WORKER_VERSION == IMAGE_TAG_VERSION


@pytest.mark.parametrize(
    ("module", "program"),
    [
        ("modelforge_node_agent.main", "modelforge-node-agent"),
        ("modelforge_runtime_worker.main", "modelforge-runtime-worker"),
    ],
)
def test_version_flags_print_the_image_tag_spelling(module: str, program: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"{program} {IMAGE_TAG_VERSION}"), done.stderr


def test_the_api_document_carries_the_image_tag_spelling() -> None:
    from chalicelib.api import openapi
    from modelforge_local_stack.http_server import load_app

    assert openapi.build(load_app().app.routes)["info"]["version"] == IMAGE_TAG_VERSION
    assert json.loads((REPO / "docs" / "openapi.json").read_text())["info"]["version"] == IMAGE_TAG_VERSION


def test_release_help_names_the_release_as_tagged(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["release", "manifest", "--help"])
    out = capsys.readouterr().out
    assert IMAGE_TAG_VERSION in out
    assert RELEASE == IMAGE_TAG_VERSION or RELEASE not in out


def _outside_the_explanation(path: Path) -> str:
    text = path.read_text()
    if path == EXPLAINED_IN[0]:
        start = text.index(EXPLAINED_IN[1])
        end = text.index("\n## ", start + 1)
        text = text[:start] + text[end:]
    return text


@pytest.mark.parametrize("path", READ_BY_PEOPLE, ids=lambda path: str(path.relative_to(REPO)))
def test_docs_spell_this_release_one_way(path: Path) -> None:
    text = _outside_the_explanation(path)
    if RELEASE != IMAGE_TAG_VERSION:
        assert RELEASE not in text, f"{path.name} spells the release {RELEASE} (PEP 440): write {IMAGE_TAG_VERSION}"
    stale = sorted(set(PRERELEASE.findall(text)) - {IMAGE_TAG_VERSION})
    assert stale == [], f"{path.name} names pre-releases {stale}, not this one ({IMAGE_TAG_VERSION})"


def test_deploy_says_where_each_form_is_required() -> None:
    text = EXPLAINED_IN[0].read_text()
    section = text[text.index(EXPLAINED_IN[1]) :]
    section = section[: section.index("\n## ", 1)]
    assert RELEASE in section and IMAGE_TAG_VERSION in section and "PEP 440" in section and "SemVer" in section
