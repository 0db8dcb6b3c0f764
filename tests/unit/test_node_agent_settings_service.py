"""node_agent_settings.check: the Enroll node wizard's choices become the node's .env settings, in
order and without a secret, or every problem by field; the image rules are the release tool's
(modelforge_protocol.release_bundle) and the pinned-reference rule (modelforge_protocol.image_reference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chalicelib.api import views
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Invalid
from chalicelib.services import node_agent_settings
from modelforge_protocol.release_bundle import NODE_AGENT_IMAGE, REQUIRED_LABELS, known_label_values
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.support.image_tarballs import release_images, write_docker_save

DIGEST = "sha256:" + "ab" * 32
TAG = f"modelforge-node-agent:{IMAGE_TAG_VERSION}"
PINNED = "registry.example.com:5000/team/modelforge-node-agent@" + DIGEST
#: The five labels: the version and title the release fixes, the others made up.
LABELS = {**{label: "x" for label in REQUIRED_LABELS}, **known_label_values(NODE_AGENT_IMAGE)}


def _entry(**changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "tag": TAG,
        "rootfs_layers": [DIGEST, "sha256:" + "cd" * 32],
        "architecture": "amd64",
        "os": "linux",
        "labels": dict(LABELS),
        "config_digest": "sha256:" + "ef" * 32,
    }
    entry.update(changes)
    return {name: value for name, value in entry.items() if value is not None}


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "control_plane_url": "https://modelforge.example.com",
        "hostname": "gpu_node",
        "accelerator_mode": "nvidia",
        "state_volume": "/mnt/user/appdata/modelforge/agent-state",
        "image_source": "release_bundle",
        "manifest_entry": json.dumps(_entry()),
    }
    body.update(changes)
    return {name: value for name, value in body.items() if value is not None}


def _problems(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (problem.field, problem.message)
        for problem in node_agent_settings.check(typed.node_agent_settings(body)).problems
    ]


def test_check_with_a_release_manifest_entry_gives_the_settings_in_order_with_the_release_tag() -> None:
    result = node_agent_settings.check(typed.node_agent_settings(_body()))
    assert result.ok and result.problems == []
    assert result.settings == [
        ("MODELFORGE_AGENT_CONTROL_PLANE_URL", "https://modelforge.example.com"),
        ("MODELFORGE_AGENT_HOSTNAME", "gpu_node"),
        ("MODELFORGE_AGENT_ACCELERATOR_MODE", "nvidia"),
        ("MODELFORGE_AGENT_TLS_VERIFY", "true"),
        ("MODELFORGE_AGENT_STATE_VOLUME", "/mnt/user/appdata/modelforge/agent-state"),
        ("MODELFORGE_AGENT_IDENTITY_MODE", "persisted"),
        ("MODELFORGE_NODE_AGENT_IMAGE", TAG),
        ("MODELFORGE_AGENT_WORKER_URL", "unix:///var/lib/modelforge/worker/worker.sock"),
    ]


def test_check_of_the_entry_the_release_tool_writes_is_ok(tmp_path: Path) -> None:
    from modelforge_cli.release_manifest import make_bundle

    archive = write_docker_save(tmp_path / "images.tar", release_images())
    written = make_bundle([archive], tmp_path / "bundle")
    entry = json.loads(written.manifest.read_text())["images"]["modelforge-node-agent"]
    result = node_agent_settings.check(typed.node_agent_settings(_body(manifest_entry=json.dumps(entry, indent=2))))
    assert result.ok, result.problems
    assert dict(result.settings)["MODELFORGE_NODE_AGENT_IMAGE"] == TAG


def test_check_ignores_the_image_and_config_id() -> None:
    for config_digest in (None, "sha256:" + "00" * 32, "not even a digest"):
        assert node_agent_settings.check(
            typed.node_agent_settings(_body(manifest_entry=json.dumps(_entry(config_digest=config_digest))))
        ).ok


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (_entry(tag="modelforge-node-agent:latest"), "tag: 'modelforge-node-agent:latest' is the floating latest tag"),
        (_entry(tag="modelforge-node-agent:1.2.0"), f"tag: expected {TAG}"),
        (_entry(tag=None), "tag: missing"),
        (_entry(rootfs_layers=None), "rootfs_layers: missing"),
        (_entry(rootfs_layers=["sha256:short"]), "rootfs_layers: layer 1"),
        (_entry(architecture=None), "architecture: missing"),
        (_entry(labels=None), "labels: missing"),
        (
            _entry(labels={label: LABELS[label] for label in REQUIRED_LABELS[1:]}),
            f"labels: {REQUIRED_LABELS[0]} missing",
        ),
        (
            _entry(labels={**LABELS, "org.opencontainers.image.version": "1.2.0"}),
            f"labels.org.opencontainers.image.version: expected {IMAGE_TAG_VERSION}, found '1.2.0'",
        ),
        (
            _entry(labels={**LABELS, "org.opencontainers.image.title": "modelforge-runtime-worker"}),
            "labels.org.opencontainers.image.title: expected modelforge-node-agent, found 'modelforge-runtime-worker'",
        ),
    ],
)
def test_check_with_a_wrong_manifest_entry_says_what_is_missing_or_wrong(entry: dict[str, Any], expected: str) -> None:
    result = node_agent_settings.check(typed.node_agent_settings(_body(manifest_entry=json.dumps(entry))))
    assert not result.ok and result.settings == []
    problems = [(problem.field, problem.message) for problem in result.problems]
    assert any(field == "manifest_entry" and message.startswith(expected) for field, message in problems), problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "missing: paste the value of images.modelforge-node-agent"),
        ("   ", "missing"),
        ('{"tag": ', "not valid JSON"),
        ('{"tag": NaN}', "not valid JSON"),
        ("[" * 10_000 + "]" * 10_000, "nested deeper"),  # nested beyond the parser: refused, not a crash
        ("[" * 20 + "]" * 20, "nested deeper than a manifest entry is"),
        ('"modelforge-node-agent": {}', "not valid JSON"),
        ("[]", "entry: not a JSON object"),
    ],
)
def test_check_with_an_unreadable_manifest_entry_is_a_problem_not_an_error(text: str, expected: str) -> None:
    problems = _problems(_body(manifest_entry=text[:32768]))
    assert len(problems) == 1 and problems[0][0] == "manifest_entry" and expected in problems[0][1], problems


def test_check_without_a_manifest_entry_in_bundle_mode_says_it_is_missing() -> None:
    assert _problems(_body(manifest_entry=None))[0][0] == "manifest_entry"


def test_check_with_a_pinned_registry_image_uses_the_reference_and_ignores_the_entry() -> None:
    result = node_agent_settings.check(
        typed.node_agent_settings(_body(image_source="registry", image_reference=f"  {PINNED} ", manifest_entry="junk"))
    )
    assert result.ok, result.problems
    assert dict(result.settings)["MODELFORGE_NODE_AGENT_IMAGE"] == PINNED


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("registry.example.com/modelforge-node-agent:1.3.0-rc.1", "not pinned by digest"),
        ("registry.example.com/modelforge-node-agent", "not pinned by digest"),
        ("modelforge-node-agent:latest", "not pinned by digest"),
        ("registry.example.com/modelforge-node-agent@sha256:abc", "the digest after @"),
        ("registry.example.com/modelforge-node-agent:latest@" + DIGEST, "names the floating latest tag"),
        ("registry.example.com/modelforge-node-agent:1.3.0@" + DIGEST, "names a tag"),
        ("Registry.example.com/Modelforge@" + DIGEST, "not a registry image name"),
        (None, "missing"),
    ],
)
def test_check_with_a_registry_image_not_pinned_by_digest_is_refused(reference: str | None, expected: str) -> None:
    problems = _problems(_body(image_source="registry", image_reference=reference))
    assert problems and all(field == "image_reference" for field, _ in problems), problems
    assert any(expected in message for _, message in problems), problems


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hostname": ""}, "hostname"),
        ({"hostname": "-gpu"}, "hostname"),
        ({"hostname": "gpu node"}, "hostname"),
        ({"state_volume": "relative/path"}, "state_volume"),
        ({"state_volume": "/"}, "state_volume"),
        ({"state_volume": "/mnt/user/app data"}, "state_volume"),
        ({"state_volume": "/mnt/$HOME"}, "state_volume"),
        ({"state_volume": "/mnt/../etc"}, "state_volume"),
        ({"control_plane_url": "https://modelforge.example.com/api"}, "control_plane_url"),
        ({"control_plane_url": "ftp://modelforge.example.com"}, "control_plane_url"),
        ({"control_plane_url": "https://user@modelforge.example.com"}, "control_plane_url"),
        ({"control_plane_url": "https://modelforge.example.com:99999"}, "control_plane_url"),
        ({"control_plane_url": "https://modelforge.example.com?x=1"}, "control_plane_url"),
    ],
)
def test_check_with_a_bad_setting_names_its_field(changes: dict[str, Any], field: str) -> None:
    assert [name for name, _ in _problems(_body(**changes))] == [field]


def test_check_lists_every_problem_at_once() -> None:
    body = _body(hostname="", state_volume="x", manifest_entry=json.dumps(_entry(tag=None, architecture=None)))
    fields = [name for name, _ in _problems(body)]
    assert fields == ["hostname", "state_volume", "manifest_entry", "manifest_entry"]


@pytest.mark.parametrize(
    "changes",
    [
        {"accelerator_mode": "gpu"},
        {"image_source": "docker_hub"},
        {"hostname": 7},
        {"token": "mfe.x"},
        {"hostname": None},
    ],
)
def test_check_with_a_body_outside_the_schema_is_invalid_request(changes: dict[str, Any]) -> None:
    with pytest.raises(Invalid):
        node_agent_settings.check(typed.node_agent_settings(_body(**changes)))


def test_the_answer_never_holds_a_token_and_lists_settings_by_name() -> None:
    answer = views.node_agent_settings(node_agent_settings.check(typed.node_agent_settings(_body())))
    assert answer["ok"] is True and answer["release"] == IMAGE_TAG_VERSION and answer["problems"] == []
    assert [setting["name"] for setting in answer["settings"]][0] == "MODELFORGE_AGENT_CONTROL_PLANE_URL"
    assert "ENROLLMENT_TOKEN" not in json.dumps(answer)
    refused = views.node_agent_settings(node_agent_settings.check(typed.node_agent_settings(_body(hostname=""))))
    assert refused["ok"] is False and refused["settings"] == [] and refused["problems"][0]["field"] == "hostname"


@pytest.mark.parametrize(
    "url",
    [
        'https://"modelforge".example.com',
        "https://modelforge$(id).example.com",
        "https://model forge.example.com",
        "https://modelforge.example.com\n",
        "https://modelforge.example.com\nMODELFORGE_AGENT_TLS_VERIFY=false",
        " https://modelforge.example.com",
        "https://modelforge.example.com\t",
        "https://modelforge.example.com/\x00",
        "http://modelforge.example.com",
        "https://[fe80::zz]",
        "https://999.1.2.3",
        "https://modelforge.example.com/#x",
    ],
)
def test_check_refuses_a_control_plane_url_that_is_not_exactly_an_origin(url: str) -> None:
    """Security pass 9: quotes, $(), spaces and control characters are refused, not dropped."""
    assert [name for name, _ in _problems(_body(control_plane_url=url))] == ["control_plane_url"]


@pytest.mark.parametrize(
    ("url", "written"),
    [
        ("https://modelforge.example.com/", "https://modelforge.example.com"),
        ("https://modelforge.example.com:8443", "https://modelforge.example.com:8443"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://localhost:8000", "http://localhost:8000"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("https://[2001:db8::1]:443", "https://[2001:db8::1]:443"),
        ("https://10.0.0.5", "https://10.0.0.5"),
    ],
)
def test_check_accepts_a_real_origin(url: str, written: str) -> None:
    result = node_agent_settings.check(typed.node_agent_settings(_body(control_plane_url=url)))
    assert result.ok, result.problems
    assert dict(result.settings)["MODELFORGE_AGENT_CONTROL_PLANE_URL"] == written


def test_check_without_a_container_names_no_image_and_reads_no_image_field() -> None:
    result = node_agent_settings.check(
        typed.node_agent_settings(_body(image_source="no_container", manifest_entry="junk", image_reference="x"))
    )
    assert result.ok, result.problems
    names = [name for name, _ in result.settings]
    assert "MODELFORGE_NODE_AGENT_IMAGE" not in names and "MODELFORGE_AGENT_WORKER_URL" not in names
    assert dict(result.settings)["MODELFORGE_AGENT_HOSTNAME"] == "gpu_node"


@pytest.mark.parametrize(("mode", "worker"), [("nvidia", True), ("auto", True), ("cpu", False)])
def test_check_with_a_container_gives_a_gpu_node_the_runtime_workers_socket(mode: str, worker: bool) -> None:
    result = node_agent_settings.check(typed.node_agent_settings(_body(accelerator_mode=mode)))
    settings = dict(result.settings)
    assert settings["MODELFORGE_NODE_AGENT_IMAGE"] == TAG
    expected = "unix:///var/lib/modelforge/worker/worker.sock" if worker else None
    assert settings.get("MODELFORGE_AGENT_WORKER_URL") == expected
