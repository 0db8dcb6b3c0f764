"""The console in headless Chromium against a real `modelforge local up`, found by role and name as
a screen reader finds it: sign in, the Hardware page, the Enroll node wizard with a manifest entry
the release tool made, its start command run with scripts/node-agent-start.sh (a stand-in docker
hands its env file to a real CPU agent), the node online, readiness until Ready, and the one-time
token gone from the page by each of the four ways the seed names. One browser and one stack for
the module; every test checks that the page logged no error and fetched nothing it should not.
Screenshots (1280x800) go to test-artifacts/."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER, ENROLLMENT_TOKEN_RE
from modelforge_protocol.release_bundle import NODE_AGENT_IMAGE, release_tag
from modelforge_protocol.versions import IMAGE_TAG_VERSION
from playwright.sync_api import expect

from tests.conftest import ADMIN_TOKEN, repo_root
from tests.support import fake_docker
from tests.support.agent_process import start_agent
from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.browser import VIEWPORT, BrowserLog, assert_secret_gone, chromium, storage
from tests.support.image_tarballs import release_images, write_docker_save
from tests.support.polling import wait_until
from tests.support.processes import RunningProcess, cli_command, run_to_exit, start_local_up

pytestmark = pytest.mark.slow
# a loaded 2-core CI machine: the page's own API calls may take seconds
expect.set_options(timeout=15_000)

REPO = repo_root()
ARTIFACTS = REPO / "test-artifacts"
ENV_NAMES = [
    "MODELFORGE_AGENT_CONTROL_PLANE_URL",
    "MODELFORGE_AGENT_HOSTNAME",
    "MODELFORGE_AGENT_ACCELERATOR_MODE",
    "MODELFORGE_AGENT_TLS_VERIFY",
    "MODELFORGE_AGENT_STATE_VOLUME",
    "MODELFORGE_AGENT_IDENTITY_MODE",
    "MODELFORGE_NODE_AGENT_IMAGE",
]
PINNED = "registry.example.com/team/modelforge-node-agent@sha256:" + "5" * 64
IMAGE_ID = "sha256:" + "9" * 64


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log = tmp_path_factory.mktemp("console-stack") / "local-up.log"
    # --verbose: the access lines are among the lines checked for secrets
    with start_local_up(log, "--verbose", env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def manifest_entry(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """images.modelforge-node-agent of the manifest `modelforge release manifest` writes for a test bundle."""
    folder = tmp_path_factory.mktemp("release")
    archive = write_docker_save(folder / "images.tar", release_images())
    made = run_to_exit(cli_command("release", "manifest", str(archive), "--out", str(folder / "bundle")))
    assert made.returncode == 0, made.stderr
    manifest = json.loads(next((folder / "bundle").glob("*-manifest.json")).read_text())
    return dict(manifest["images"][NODE_AGENT_IMAGE])


@dataclass
class Console:
    page: Any
    log: BrowserLog
    url: str
    api: ControlPlane

    def open(self) -> Any:
        return self.page.goto(f"{self.url}/console/")

    def sign_in(self, token: str = ADMIN_TOKEN) -> None:
        self.page.get_by_label("Admin token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()
        expect(self.page.get_by_role("heading", name="Hardware", level=1)).to_be_visible()

    def open_wizard(self) -> Any:
        self.page.get_by_role("button", name="Enroll node").click()
        wizard = self.page.get_by_role("dialog", name="Enroll node")
        expect(wizard).to_be_visible()
        return wizard

    def choose(self, wizard: Any, name: str = "Console Node", expiry: str = "15 minutes", **fields: str) -> None:
        wizard.get_by_label("Display name").fill(name)
        wizard.get_by_role("radio", name=expiry, exact=True).check()
        if "accelerator" in fields:
            wizard.get_by_label("Accelerator mode").select_option(fields["accelerator"])
        if "state_volume" in fields:
            wizard.get_by_label("State volume").fill(fields["state_volume"])
        if "reference" in fields:
            wizard.get_by_role("radio", name="Registry image").check()
            wizard.get_by_label("Image reference").fill(fields["reference"])
        if "entry" in fields:
            wizard.get_by_label("Release manifest entry").fill(fields["entry"])

    def create(self, wizard: Any) -> str:
        """Create the token; the token the page shows."""
        wizard.get_by_role("button", name="Create enrollment token").click()
        token = str(wizard.get_by_label("One-time token").input_value())
        assert ENROLLMENT_TOKEN_RE.fullmatch(token), "no enrollment token was shown"
        return token

    def block(self, wizard: Any, name: str) -> str:
        return str(wizard.get_by_role("region", name=name).locator("pre").inner_text())

    def screenshot(self, name: str, **options: Any) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), **options)


@pytest.fixture()
def console(browser: Any, stack: RunningProcess) -> Iterator[Console]:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    yield Console(page, BrowserLog.of(page), stack.api_url, ControlPlane(stack.api_url, ADMIN_TOKEN))
    context.close()


# --- the node's side: the start command and the recreation command, as pasted -----------------


@dataclass
class Node:
    """A node-agent checkout: the repository's scripts and compose files, a stand-in docker."""

    folder: Path
    docker_log: Path
    path: str

    @classmethod
    def make(cls, root: Path) -> Node:
        folder = root / "node-agent-repository"
        folder.mkdir()
        for name in [
            "scripts",
            "docker-compose.yml",
            "docker-compose.node-agent.yml",
            "docker-compose.node-agent.cpu.yml",
            "docker-compose.node-agent.private-ca.yml",
        ]:
            (folder / name).symlink_to(REPO / name)
        fake_docker.install(root / "bin", root / "docker-log")
        return cls(folder, root / "docker-log" / "calls.jsonl", f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")

    def paste(self, command: str, typed: str = "") -> subprocess.CompletedProcess[str]:
        """Run ``command`` in Bash here; ``typed`` is what the operator types (the token)."""
        env = {**os.environ, "PATH": self.path, "FAKE_DOCKER_IMAGE_ID": IMAGE_ID}
        done = subprocess.run(
            ["bash", "-c", command], cwd=self.folder, input=typed, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done

    def compose_up_env(self) -> tuple[dict[str, str], dict[str, Any], list[str]]:
        """The env file the last `docker compose ... up` was given: settings, file facts, argv."""
        calls = [json.loads(line) for line in self.docker_log.read_text().splitlines()]
        up = [call for call in calls if call["name"] == "compose-up"][-1]
        ((path, facts),) = up["env_files"].items()
        assert not Path(path).exists(), "the temporary env file outlived the script"
        settings = dict(line.split("=", 1) for line in facts["text"].splitlines() if line and not line.startswith("#"))
        return settings, facts, up["argv"]


# --- the scenario -------------------------------------------------------------------------------


def test_enroll_a_cpu_agent_from_the_console_until_it_is_ready(
    console: Console, stack: RunningProcess, manifest_entry: dict[str, Any], tmp_path: Path
) -> None:
    page = console.page
    answer = console.open()
    assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    console.screenshot("sign-in")
    console.sign_in()
    at_sign_in = storage(page)

    wizard = console.open_wizard()
    expiry = wizard.get_by_role("radiogroup", name="Token expiry")
    assert [radio.get_attribute("value") for radio in expiry.get_by_role("radio").all()] == [
        "300",
        "900",
        "3600",
        "86400",
    ]
    for label in ("5 minutes", "15 minutes", "1 hour", "24 hours"):
        expect(expiry.get_by_role("radio", name=label, exact=True)).to_have_count(1)
    source = wizard.get_by_role("radiogroup", name="Image source")
    assert [radio.get_attribute("value") for radio in source.get_by_role("radio").all()] == [
        "release_bundle",
        "registry",
        "no_container",
    ]
    expect(source.get_by_role("radio", name="Registry image")).to_have_count(1)
    eligible = wizard.get_by_role("checkbox", name="Production eligible")
    expect(eligible).to_be_disabled()
    expect(eligible).not_to_be_checked()
    expect(wizard.get_by_text("production_eligible=false")).to_be_visible()
    origin = wizard.get_by_label("API origin")
    expect(origin).to_have_value(stack.api_url)
    expect(origin).not_to_be_editable()
    expect(source.get_by_role("radio", name="Local release bundle")).to_be_checked()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    console.choose(wizard, accelerator="cpu", state_volume=str(state), entry=json.dumps(manifest_entry, indent=2))
    token = console.create(wizard)
    expect(wizard.get_by_role("timer")).to_have_text(re.compile(r"^1[45]:\d\d$"))

    env_text = console.block(wizard, "Generated .env")
    settings = dict(line.split("=", 1) for line in env_text.splitlines())
    assert list(settings) == ENV_NAMES
    assert settings == {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": stack.api_url,
        "MODELFORGE_AGENT_HOSTNAME": "console_node",
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_TLS_VERIFY": "true",
        "MODELFORGE_AGENT_STATE_VOLUME": str(state),
        "MODELFORGE_AGENT_IDENTITY_MODE": "persisted",
        "MODELFORGE_NODE_AGENT_IMAGE": release_tag(NODE_AGENT_IMAGE),
    }
    start = console.block(wizard, "Start command")
    recreate = console.block(wizard, "Container recreation command")
    assert start.rstrip().endswith("bash scripts/node-agent-start.sh .env") and env_text in start
    assert recreate.rstrip().endswith("bash scripts/recreate-node-agent.sh .env")
    for text in (env_text, start, recreate):
        assert token not in text and "ENROLLMENT_TOKEN" not in text
    console.screenshot("wizard-after-create", mask=[wizard.get_by_label("One-time token")], mask_color="#8c959f")

    # the operator pastes the start command on the node and types the token at its prompt
    node = Node.make(tmp_path)
    started = node.paste(start, typed=token + "\n")
    assert token not in started.stdout + started.stderr
    assert "ENROLLMENT_TOKEN" not in (node.folder / ".env").read_text()
    agent_env, facts, argv = node.compose_up_env()
    assert (facts["mode"], facts["folder_mode"]) == (0o600, 0o700)
    assert argv[-5:] == ["-d", "--no-build", "--pull", "never", "node-agent"] and argv.count("up") == 1
    assert agent_env == {**settings, "MODELFORGE_AGENT_ENROLLMENT_TOKEN": token}

    # what Compose would hand the container, to a real agent (heartbeating fast for the test)
    agent_log = tmp_path / "agent.log"
    with start_agent(
        agent_log,
        {**agent_env, "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": "0.5", "MODELFORGE_AGENT_LOG_FORMAT": "text"},
    ):
        enrollment_id = token.split(".")[1]
        node_id = wait_until(
            lambda: console.api.admin("GET", f"/api/v1/admin/node-enrollments/{enrollment_id}").json()["node_id"],
            30,
            "the enrollment to be consumed",
            detail=agent_log.read_text,
        )
        row = page.get_by_role("row").filter(has_text=node_id)
        expect(row.locator(".status")).to_have_text("online", timeout=20_000)
        expect(row.get_by_role("rowheader")).to_have_text("Console Node")

        check = wizard.get_by_role("button", name="Check node readiness")
        verdict = wizard.get_by_role("status", name="Readiness")
        with page.expect_response(re.compile(r"/readiness$")):
            check.click()
        assert_secret_gone(page, token)  # checking readiness cleared the reveal
        expect(wizard.get_by_text("The one-time token is no longer shown: you checked readiness.")).to_be_visible()

        def ready() -> bool:
            if verdict.inner_text() == "Ready":
                return True
            with page.expect_response(re.compile(r"/readiness$")):
                check.click()
            return False

        wait_until(ready, 30, "the wizard to say Ready", interval=0.5, detail=agent_log.read_text)
        expect(wizard.get_by_text(f"Node {node_id}", exact=False)).to_be_visible()
        results = wizard.get_by_role("table", name="Readiness checks").get_by_role("row").all()[1:]
        # the seven checks, push_channel (which passes in fallback too) and gpu_health (no GPUs)
        assert len(results) == 9 and all(result.get_by_role("cell").first.inner_text() == "Pass" for result in results)
        wizard.get_by_role("heading", name="Node readiness").evaluate("(heading) => heading.scrollIntoView()")
        console.screenshot("readiness")

        wizard.get_by_role("button", name="Close").click()
        expect(page.get_by_role("dialog")).to_have_count(0)
        assert_secret_gone(page, token)
        assert storage(page)["historyLength"] == at_sign_in["historyLength"] and page.url == f"{stack.api_url}/console/"
        console.screenshot("hardware")

        # after the enrollment is consumed: the container is recreated without the token
        node.paste(recreate)
        recreated, _, argv = node.compose_up_env()
        assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" not in recreated and token not in json.dumps(recreated)
        assert recreated == settings and "--force-recreate" in argv

        _node_detail_and_revoke(console, node_id)
    console.log.assert_clean([token, ADMIN_TOKEN])
    # nor in a log: the control plane's (`local up`) and the agent's, both with lines to look at
    parsed = ENROLLMENT_TOKEN_RE.fullmatch(token)
    assert parsed is not None
    enrollment_secret = parsed.group(2)
    for name, text, seen in (("local up", stack.output(), "http_request"), ("agent", agent_log.read_text(), node_id)):
        assert seen in text, f"the {name} log has no {seen}: nothing was checked"
        assert token not in text and enrollment_secret not in text, f"the one-time token is in the {name} log"
        assert ADMIN_TOKEN not in text, f"the admin token is in the {name} log"


def _node_detail_and_revoke(console: Console, node_id: str) -> None:
    page = console.page
    page.get_by_role("button", name="Console Node").click()
    detail = page.get_by_role("dialog", name="Node Console Node")
    expect(detail.get_by_text(node_id).first).to_be_visible()
    expect(detail.get_by_role("heading", name="Inventory")).to_be_visible()
    # an agent without a runtime worker reports no job slots
    expect(detail.get_by_text("Job slots")).to_be_visible()
    detail.get_by_role("button", name="Check readiness").click()
    expect(detail.get_by_role("status", name="Readiness")).to_have_text("Ready")

    expect(detail.get_by_role("button", name="Delete node")).to_be_disabled()  # online, credential active
    detail.get_by_role("button", name="Revoke credential").click()
    confirm = page.get_by_role("alertdialog", name="Revoke credential?")
    confirm.get_by_role("button", name="Cancel").click()
    expect(confirm).to_have_count(0)
    assert console.api.node(node_id)["credential"]["state"] == "active"
    detail.get_by_role("button", name="Revoke credential").click()
    page.get_by_role("alertdialog", name="Revoke credential?").get_by_role("button", name="Revoke credential").click()
    expect(detail.get_by_text("The credential was revoked.")).to_be_visible()
    assert console.api.node(node_id)["credential"]["state"] == "revoked"

    # revoked: the node can be deleted, after a confirmation like the revocation's
    detail.get_by_role("button", name="Delete node").click()
    confirm = page.get_by_role("alertdialog", name="Delete node?")
    confirm.get_by_role("button", name="Cancel").click()
    expect(confirm).to_have_count(0)
    assert console.api.node(node_id)["node_id"] == node_id
    detail.get_by_role("button", name="Delete node").click()
    console.screenshot("delete-node")
    page.get_by_role("alertdialog", name="Delete node?").get_by_role("button", name="Delete node").click()
    expect(detail).to_have_count(0)
    assert console.api.admin("GET", f"/api/v1/admin/nodes/{node_id}").status_code == 404
    expect(page.get_by_role("button", name="Console Node")).to_have_count(0)  # the Hardware list refreshed


# --- signing in -----------------------------------------------------------------------------------


def test_a_wrong_admin_token_shows_the_apis_message_and_a_reload_asks_again(console: Console) -> None:
    wrong = "not-the-admin-token-" + "x" * 24
    refusal = requests.get(f"{console.url}/api/v1/admin/nodes?limit=1", headers={ADMIN_TOKEN_HEADER: wrong}, timeout=10)
    console.log.expect_refusal(403, "/api/v1/admin/nodes")
    console.open()
    console.page.get_by_label("Admin token").fill(wrong)
    console.page.get_by_role("button", name="Sign in").click()
    expect(console.page.get_by_role("alert")).to_have_text(refusal.json()["error"]["message"])
    expect(console.page.get_by_role("heading", name="Hardware")).to_have_count(0)
    console.sign_in()
    console.page.wait_for_load_state("networkidle")
    console.page.reload()
    expect(console.page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(console.page.get_by_label("Admin token")).to_have_value("")
    assert_secret_gone(console.page, ADMIN_TOKEN)
    console.log.assert_clean([wrong, ADMIN_TOKEN])


# --- each other way the reveal is cleared -----------------------------------------------------------


def test_closing_the_wizard_with_escape_clears_the_token(console: Console) -> None:
    console.open()
    console.sign_in()
    wizard = console.open_wizard()
    console.choose(wizard, reference=PINNED)
    token = console.create(wizard)
    console.page.keyboard.press("Escape")
    expect(console.page.get_by_role("dialog")).to_have_count(0)
    assert_secret_gone(console.page, token)
    enrollment_id = token.split(".")[1]
    assert console.api.admin("GET", f"/api/v1/admin/node-enrollments/{enrollment_id}").json()["status"] == "pending"
    console.log.assert_clean([token, ADMIN_TOKEN])


def test_revoking_the_unused_token_clears_it_and_the_token_no_longer_enrolls(console: Console) -> None:
    console.page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=console.url)
    console.open()
    console.sign_in()
    wizard = console.open_wizard()
    console.choose(wizard, reference=PINNED)
    token = console.create(wizard)
    wizard.get_by_role("button", name="Copy token").click()
    expect(wizard.get_by_text("token copied to the clipboard")).to_be_visible()
    assert console.page.evaluate("navigator.clipboard.readText()") == token
    assert wizard.get_by_role("button", name="Copy token").evaluate("(button) => button.outerHTML").count("mfe.") == 0

    wizard.get_by_role("button", name="Revoke unused token").click()
    expect(wizard.get_by_text("its token can no longer enroll a node")).to_be_visible()
    expect(wizard.get_by_text("The one-time token is no longer shown: you revoked it.")).to_be_visible()
    assert_secret_gone(console.page, token)
    refused = console.api.enroll(token, AgentIdentity())
    assert refused.status_code == 410 and refused.json()["error"]["code"] == "enrollment_token_revoked"
    console.log.assert_clean([token, ADMIN_TOKEN])


def test_reaching_the_expiry_clears_the_token(console: Console) -> None:
    console.page.clock.install()
    console.open()
    console.sign_in()
    wizard = console.open_wizard()
    console.choose(wizard, expiry="5 minutes", reference=PINNED)
    token = console.create(wizard)
    timer = wizard.get_by_role("timer")
    expect(timer).to_have_text(re.compile(r"^[45]:\d\d$"))
    console.page.clock.fast_forward("04:00")
    expect(timer).to_have_text(re.compile(r"^[01]:\d\d$"))
    assert wizard.get_by_label("One-time token").input_value() == token
    console.page.clock.fast_forward("01:01")
    expect(wizard.get_by_text("The one-time token is no longer shown: it expired")).to_contain_text(
        "close the wizard and open it again for a new token"
    )
    assert_secret_gone(console.page, token)
    console.log.assert_clean([token, ADMIN_TOKEN])


# --- readiness: never Ready merely because the node connected ----------------------------------------


def test_a_connected_node_that_fails_a_check_is_not_ready(console: Console) -> None:
    """The node enrolled with the wizard's token and heartbeats (online, connection passes), but
    reports itself degraded: the wizard says Not ready, with the failing check and its next step."""
    console.open()
    console.sign_in()
    wizard = console.open_wizard()
    console.choose(wizard, name="Degraded Node", reference=PINNED)
    token = console.create(wizard)
    identity = AgentIdentity()
    enrolled = console.api.enroll(token, identity)
    assert enrolled.status_code == 201, enrolled.text
    beat = console.api.heartbeat(identity, health={"status": "degraded"})
    assert beat.status_code == 200 and beat.json()["status"] == "online", beat.text

    wizard.get_by_role("button", name="Check node readiness").click()
    expect(wizard.get_by_role("status", name="Readiness")).to_have_text("Not ready")
    expect(wizard.get_by_text(f"Node {identity.node_id} (online)")).to_be_visible()
    checks = wizard.get_by_role("table", name="Readiness checks")

    def result(check: str) -> Any:
        return checks.get_by_role("row").filter(has=console.page.get_by_role("rowheader", name=check, exact=True))

    expect(result("Connection").get_by_role("cell").first).to_have_text("Pass")
    expect(result("Agent health").get_by_role("cell").first).to_have_text("Fail")
    expect(result("Agent health")).to_contain_text("agent reports degraded")
    expect(result("Agent health")).to_contain_text("read the agent's log")
    assert_secret_gone(console.page, token)
    console.log.assert_clean([token, ADMIN_TOKEN])


# --- what the wizard refuses ------------------------------------------------------------------------


def _enrollment_count(api: ControlPlane) -> int:
    return len(api.admin("GET", "/api/v1/admin/node-enrollments").json()["enrollments"])


def test_a_wrong_manifest_entry_is_refused_with_the_reason(console: Console, manifest_entry: dict[str, Any]) -> None:
    wrong = {**manifest_entry, "tag": "modelforge-node-agent:1.2.9", "config_digest": "sha256:" + "0" * 64}
    wrong["labels"] = {name: value for name, value in wrong["labels"].items() if not name.endswith(".revision")}
    wrong["labels"]["org.opencontainers.image.version"] = "1.2.9"
    before = _enrollment_count(console.api)
    console.open()
    console.sign_in()
    wizard = console.open_wizard()
    console.choose(wizard, entry=json.dumps(wrong))
    wizard.get_by_role("button", name="Create enrollment token").click()
    alert = wizard.get_by_role("alert")
    expect(alert).to_contain_text(
        f"Release manifest entry: tag: expected {release_tag(NODE_AGENT_IMAGE)}, found 'modelforge-node-agent:1.2.9'"
    )
    expect(alert).to_contain_text("Release manifest entry: labels: org.opencontainers.image.revision missing")
    expect(alert).to_contain_text(
        f"Release manifest entry: labels.org.opencontainers.image.version: expected {IMAGE_TAG_VERSION}, found '1.2.9'"
    )
    expect(alert).not_to_contain_text("config")  # the image/config ID is ignored
    expect(wizard.get_by_label("Release manifest entry")).to_have_attribute("aria-invalid", "true")
    expect(wizard.get_by_label("Release manifest entry")).to_be_focused()
    expect(wizard.get_by_label("One-time token")).to_have_count(0)
    assert _enrollment_count(console.api) == before
    console.log.assert_clean([ADMIN_TOKEN])


def test_a_registry_image_without_a_digest_is_refused(console: Console) -> None:
    before = _enrollment_count(console.api)
    console.open()
    console.sign_in()
    wizard = console.open_wizard()
    console.choose(wizard, reference="registry.example.com/team/modelforge-node-agent:1.3.0-rc.1")
    wizard.get_by_role("button", name="Create enrollment token").click()
    expect(wizard.get_by_role("alert")).to_contain_text("Image reference: not pinned by digest")
    expect(wizard.get_by_label("One-time token")).to_have_count(0)
    assert _enrollment_count(console.api) == before
    wizard.get_by_label("Image reference").fill(PINNED)
    token = console.create(wizard)
    assert f"MODELFORGE_NODE_AGENT_IMAGE={PINNED}" in console.block(wizard, "Generated .env").splitlines()
    console.log.assert_clean([token, ADMIN_TOKEN])


# --- the keyboard alone -------------------------------------------------------------------------------

_FOCUSED = """() => {
  const element = document.activeElement;
  const dialog = element.closest("dialog");
  const label = element.labels && element.labels.length ? element.labels[0].innerText
    : element.tagName === "PRE" ? element.closest("section").querySelector("h3").innerText : element.innerText;
  return { inDialog: dialog !== null && dialog.open, name: `${element.tagName.toLowerCase()}:${(label || "").trim()}` };
}"""


def _tab_cycle(page: Any, presses: int, key: str = "Tab") -> list[str]:
    names = []
    for _ in range(presses):
        page.keyboard.press(key)
        focused = page.evaluate(_FOCUSED)
        assert focused["inDialog"], f"focus left the dialog: {focused}"
        names.append(focused["name"])
    return names


def _tab_to(page: Any, name: str) -> None:
    """Press Tab until ``name`` has the focus (at most 40 times)."""
    for _ in range(40):
        if page.evaluate(_FOCUSED)["name"] == name:
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached {name}")


def test_the_wizard_works_with_the_keyboard_alone(console: Console) -> None:
    page = console.page
    console.open()
    page.get_by_label("Admin token").press_sequentially(ADMIN_TOKEN)
    page.keyboard.press("Enter")
    enroll = page.get_by_role("button", name="Enroll node")
    expect(enroll).to_be_visible()
    _tab_to(page, "button:Enroll node")  # from wherever signing in left the focus, by Tab alone
    page.keyboard.press("Enter")
    wizard = page.get_by_role("dialog", name="Enroll node")
    expect(wizard.get_by_label("Display name")).to_be_focused()
    page.keyboard.type("Keyboard Node")

    visited = _tab_cycle(page, 24)
    for control in [
        "input:15 minutes",
        "input:API origin",
        "input:Hostname",
        "select:Accelerator mode",
        "input:State volume",
        "input:Local release bundle",
        "textarea:Release manifest entry",
        "button:Create enrollment token",
        "button:Close",
        "input:Display name",
    ]:
        assert control in visited, (control, visited)
    assert visited.index("button:Close") + 1 == visited.index("input:Display name"), "Tab does not wrap around"
    _tab_to(page, "input:Display name")
    assert _tab_cycle(page, 1, "Shift+Tab") == ["button:Close"]

    _tab_to(page, "input:15 minutes")  # the checked expiry takes Tab; arrows choose another
    page.keyboard.press("ArrowRight")
    expect(wizard.get_by_role("radio", name="1 hour")).to_be_checked()
    _tab_to(page, "input:Local release bundle")
    page.keyboard.press("ArrowRight")
    expect(wizard.get_by_role("radio", name="Registry image")).to_be_checked()
    page.keyboard.press("Tab")
    expect(wizard.get_by_label("Image reference")).to_be_focused()
    page.keyboard.type(PINNED)
    page.keyboard.press("Enter")
    token_field = wizard.get_by_label("One-time token")
    expect(token_field).to_be_focused()
    token = str(token_field.input_value())

    visited = _tab_cycle(page, 20)
    for control in [
        "button:Copy token",
        "pre:Generated .env",
        "button:Copy .env",
        "pre:Start command",
        "button:Copy start command",
        "pre:Container recreation command",
        "button:Copy container recreation command",
        "button:Check node readiness",
        "button:Revoke unused token",
        "button:Close",
        "input:One-time token",
    ]:
        assert control in visited, (control, visited)
    _tab_to(page, "button:Check node readiness")
    page.keyboard.press("Enter")
    expect(wizard.get_by_role("status", name="Readiness")).to_have_text("Not ready")
    expect(wizard.get_by_text("no node has enrolled with it yet")).to_be_visible()
    assert_secret_gone(page, token)
    page.keyboard.press("Escape")
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(enroll).to_be_focused()
    console.log.assert_clean([token, ADMIN_TOKEN])


# --- the Hardware page's columns (last: it adds nodes the other tests' screenshots would show) --------


def test_the_hardware_table_shows_gpus_telemetry_duplicates_and_the_current_job(console: Console) -> None:
    api = console.api
    inventory = {**gpu_inventory(2), "capabilities": ["cuda", "diagnostic.echo"]}
    gpu_node, twin = AgentIdentity(), AgentIdentity()
    for identity in (gpu_node, twin):  # the same GPUs reported twice: one host enrolled twice
        enrolled = api.enroll(
            api.mint(display_name="GPU Twin")["token"], identity, accelerator_mode="nvidia", inventory=inventory
        )
        assert enrolled.status_code == 201, enrolled.text
        assert api.heartbeat(identity, gpus=2).status_code == 200
    submitted = api.submit_work("diagnostic.echo", {"hello": "console"})
    assert submitted.status_code == 201, submitted.text
    assert api.claim(gpu_node).status_code == 200
    work_id = submitted.json()["work_id"]

    console.open()
    console.sign_in()
    page = console.page
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=str(gpu_node.node_id), exact=True))
    expect(row).to_have_count(1)
    cells = [str(text) for text in row.get_by_role("cell").all_inner_texts()]
    # Node ID, Status, Last heartbeat, GPUs, GPU telemetry, Production eligible, Agent, Protocol,
    # Duplicate identity, Capabilities, Current job (the name is the row's header)
    assert cells[0] == gpu_node.node_id and cells[1] == "online" and cells[2].endswith("s ago")
    assert cells[3] == "2: 2 × NVIDIA H200"
    assert cells[4].splitlines() == [f"GPU {index}: 87.5% · 94.3 GiB / 133.9 GiB · 64 °C" for index in (0, 1)]
    assert cells[5:8] == ["no", "1.3.0", "1 (COMPATIBLE)"]
    assert cells[8] == f"suspected: {twin.node_id}"
    assert cells[9] == "cuda, diagnostic.echo"
    assert cells[10] == f"diagnostic.echo {work_id} (attempt 1)"
    console.log.assert_clean([ADMIN_TOKEN])


def test_a_latched_gpu_fault_shows_on_the_node_page_and_clear_gpu_fault_clears_it(console: Console) -> None:
    api = console.api
    inventory = {**gpu_inventory(2), "capabilities": ["cuda", "diagnostic.echo"]}
    inventory["gpus"] = [
        {**gpu, "uuid": f"GPU-c0n5013{index}-0000-4000-8000-000000000000"}
        for index, gpu in enumerate(inventory["gpus"])
    ]
    identity = AgentIdentity()
    enrolled = api.enroll(
        api.mint(display_name="Faulty GPU")["token"], identity, accelerator_mode="nvidia", inventory=inventory
    )
    assert enrolled.status_code == 201, enrolled.text
    faulty, healthy = (gpu["uuid"] for gpu in inventory["gpus"])
    xid = {"code": "xid_48", "action": "reset_gpu", "xid": 48, "since": "2026-12-02T10:00:00Z"}
    grades = [
        {"uuid": faulty, "state": "unschedulable", "reasons": [xid]},
        {"uuid": healthy, "state": "healthy", "reasons": []},
    ]
    beat = api.heartbeat(identity, gpus=2, boot_id="0b0b0b0b-0000-4000-8000-00000000c0de", gpu_health={"gpus": grades})
    assert beat.status_code == 200 and beat.json()["blocked_gpus"] == [{"uuid": faulty, "reason": "latched"}], beat.text

    console.open()
    console.sign_in()
    page = console.page
    page.get_by_role("button", name="Faulty GPU").click()
    detail = page.get_by_role("dialog", name="Node Faulty GPU")
    table = detail.get_by_role("table", name="GPU health")
    faulty_row = table.get_by_role("row").filter(has=page.get_by_role("cell", name=faulty, exact=True))
    expect(faulty_row).to_have_count(1)
    cells = [str(text) for text in faulty_row.get_by_role("cell").all_inner_texts()]
    assert cells[:4] == [faulty, "unschedulable", "no", "latched"]
    assert cells[4] == "xid_48 (Xid 48): reset_gpu since 2026-12-02 10:00:00 UTC"
    console.screenshot("gpu-health")
    # only the latched GPU has the button
    expect(table.get_by_role("button")).to_have_count(1)
    table.get_by_role("button", name=f"Clear GPU fault {faulty}").click()
    expect(detail.get_by_text(f"The fault of {faulty} was cleared")).to_be_visible()
    gpus = {gpu["uuid"]: gpu for gpu in api.node(identity.node_id or "")["gpu_health"]}
    assert (gpus[faulty]["latched"], gpus[faulty]["recheck_pending"]) == (False, True)
    expect(table.get_by_role("button")).to_have_count(0)
    detail.get_by_role("button", name="Close").click()
    console.log.assert_clean([ADMIN_TOKEN])
