"""The Enroll node wizard's third image source, "No container" (issue 21, first hour 6), in
headless Chromium against a real `modelforge local up`: its .env names no image, its start command
is scripts/node-agent-start.sh --no-container, pasted as the operator would in a checkout, which
runs the real agent process from the checkout's .venv until the node is Ready; "Revoke unused
token" disappears once the token is used; the restart command runs the agent again without the
token. The wizard says which API the node uses and what a node-month costs there. And security
pass 9: a control_plane_url that is not exactly an origin is refused, shown at "API origin", and
nothing is minted. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import requests
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER
from playwright.sync_api import expect

from tests.conftest import ADMIN_TOKEN
from tests.integration import test_console_browser as base
from tests.integration.test_console_browser import REPO, Console
from tests.support.polling import wait_until
from tests.support.processes import LoggedProcess, RunningProcess

pytestmark = pytest.mark.slow
expect.set_options(timeout=15_000)

# the console test module's fixtures: one `local up` and one browser for this module too
stack = base.stack
browser = base.browser
console = base.console
ENROLL_JS = REPO / "functions" / "chalicelib" / "api" / "console_assets" / "enroll.js"


def _checkout(root: Path) -> Path:
    """A checkout as the operator has it: the scripts, and the .venv that scripts/dev-up made."""
    folder = root / "checkout"
    folder.mkdir()
    for name in ("scripts", ".venv", "docker-compose.yml", "docker-compose.node-agent.yml"):
        (folder / name).symlink_to(REPO / name)
    return folder


def _paste(folder: Path, command: str, log: Path, typed: Path | None = None) -> LoggedProcess:
    """``command`` pasted into Bash in ``folder``, still running (the agent runs in the foreground)."""
    script = folder.parent / f"pasted-{log.stem}.sh"
    # its last line replaces the shell, so that a signal to this process reaches the node's script
    script.write_text(re.sub(r"^bash scripts/", "exec bash scripts/", command, flags=re.M) + "\n")
    stdin = f" < {typed}" if typed else ""
    return LoggedProcess(
        ["bash", "-c", f"cd {folder} && exec bash {script}{stdin}"], log, {"TMPDIR": str(folder.parent)}
    )


def test_no_container_enrollment_runs_the_agent_process_until_ready(
    console: Console, stack: RunningProcess, tmp_path: Path
) -> None:
    page = console.page
    console.open()
    console.sign_in()
    wizard = console.open_wizard()
    source = wizard.get_by_role("radiogroup", name="Image source")
    source.get_by_role("radio", name="No container").check()
    expect(wizard.get_by_label("Release manifest entry")).to_be_hidden()
    expect(wizard.get_by_label("Image reference")).to_be_hidden()
    # the origin is a loopback one here: the note says so, and costs nothing per node
    expect(wizard.get_by_text("a local stack has no per-node cost")).to_be_visible()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    console.choose(wizard, name="Bench Box", accelerator="cpu", state_volume=str(state))
    token = console.create(wizard)

    env_text = console.block(wizard, "Generated .env")
    settings = dict(line.split("=", 1) for line in env_text.splitlines())
    assert "MODELFORGE_NODE_AGENT_IMAGE" not in settings and "MODELFORGE_AGENT_WORKER_URL" not in settings
    assert settings["MODELFORGE_AGENT_HOSTNAME"] == "bench_box"
    start = console.block(wizard, "Start command")
    restart = console.block(wizard, "Recreation command")
    assert start.rstrip().endswith("bash scripts/node-agent-start.sh --no-container .env") and env_text in start
    assert restart.rstrip().endswith("bash scripts/recreate-node-agent.sh --no-container .env")
    assert "docker" not in start and token not in start + restart
    console.screenshot("wizard-no-container", mask=[wizard.get_by_label("One-time token")], mask_color="#8c959f")

    # pasted in a checkout, the token typed at the prompt; the test's one change: a fast heartbeat
    folder = _checkout(tmp_path)
    fast = start.replace(
        "bash scripts/node-agent-start.sh --no-container .env",
        "printf 'MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS=0.5\\nMODELFORGE_AGENT_LOG_FORMAT=text\\n' >> .env\n"
        "bash scripts/node-agent-start.sh --no-container .env",
    )
    typed = tmp_path / "typed"
    typed.write_text(token + "\n")
    with _paste(folder, fast, tmp_path / "start.log", typed) as started:
        enrollment_id = token.split(".")[1]
        node_id = wait_until(
            lambda: console.api.admin("GET", f"/api/v1/admin/node-enrollments/{enrollment_id}").json()["node_id"],
            60,
            "the enrollment to be consumed",
            detail=started.output,
        )
        revoke = wizard.get_by_role("button", name="Revoke unused token")
        expect(revoke).to_be_visible()
        check = wizard.get_by_role("button", name="Check node readiness")
        verdict = wizard.get_by_role("status", name="Readiness")

        def ready() -> bool:
            with page.expect_response(re.compile(r"/readiness$")):
                check.click()
            return bool(verdict.inner_text() == "Ready")

        wait_until(ready, 60, "the wizard to say Ready", interval=0.5, detail=started.output)
        # issue 21, words: the token was used, so nothing offers to revoke it any more
        expect(revoke).to_have_count(0)
        console.screenshot("readiness-no-container")
        assert console.api.node(node_id)["hostname"] == "bench_box"
        assert token not in started.output()

        # the restart command: stops the agent above and runs it again without the token
        with _paste(folder, restart, tmp_path / "restart.log") as restarted:
            assert started.process.wait(timeout=60) == 0, started.output()
            wait_until(
                lambda: "starting" in restarted.output() and console.api.node(node_id)["status"] == "online",
                60,
                "the restarted agent to heartbeat",
                detail=restarted.output,
            )
            pid = int(re.findall(r"^\d+$", _agent_pids(state), re.M)[0])
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"MODELFORGE_AGENT_STATE_VOLUME=" + str(state).encode() in environment
            assert not any(entry.startswith(b"MODELFORGE_AGENT_ENROLLMENT_TOKEN=") for entry in environment)
            assert restarted.stop(signal.SIGTERM) == 143
    assert [path for path in tmp_path.iterdir() if path.name.startswith("modelforge-node-agent.")] == []
    console.log.assert_clean([token, ADMIN_TOKEN])


def _agent_pids(state: Path) -> str:
    """The PIDs of this user's agent processes on ``state`` (as scripts/_node_agent_process.sh finds them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (
            b"MODELFORGE_AGENT_STATE_VOLUME=" + str(state).encode() in environment
            and b"modelforge-node-agent" in command
        ):
            found.append(entry.name)
    return "\n".join(found)


BAD_ORIGINS = [
    'https://"modelforge".example.com',
    "https://modelforge$(id).example.com",
    "https://model forge.example.com",
    "https://modelforge.example.com\nMODELFORGE_AGENT_TLS_VERIFY=false",
]


@pytest.mark.parametrize("origin", BAD_ORIGINS)
def test_a_control_plane_url_that_is_not_exactly_an_origin_is_refused_and_nothing_is_minted(
    console: Console, origin: str
) -> None:
    """Security pass 9. The wizard sends its locked origin; here the request is rewritten on the way
    to hold what a tampered page or a hostile Host could make of it."""
    page = console.page

    def rewrite(route: Any) -> None:
        body = json.loads(route.request.post_data or "{}")
        route.continue_(post_data=json.dumps({**body, "control_plane_url": origin}))

    page.route("**/api/v1/admin/node-agent-settings/check", rewrite)
    before = len(console.api.admin("GET", "/api/v1/admin/node-enrollments").json()["enrollments"])
    console.open()
    console.sign_in()
    wizard = console.open_wizard()
    wizard.get_by_role("radiogroup", name="Image source").get_by_role("radio", name="No container").check()
    console.choose(wizard, name="Tampered")
    wizard.get_by_role("button", name="Create enrollment token").click()
    expect(wizard.get_by_role("alert")).to_contain_text("Nothing was created")
    expect(wizard.get_by_role("alert")).to_contain_text("API origin: must be an origin")
    expect(wizard.get_by_label("API origin")).to_have_attribute("aria-invalid", "true")
    expect(wizard.get_by_label("One-time token")).to_have_count(0)
    assert len(console.api.admin("GET", "/api/v1/admin/node-enrollments").json()["enrollments"]) == before
    # and the API itself, as any client reaches it
    answer = requests.post(
        f"{console.url}/api/v1/admin/node-agent-settings/check",
        headers={ADMIN_TOKEN_HEADER: ADMIN_TOKEN},
        json={
            "control_plane_url": origin,
            "hostname": "gpu_node",
            "accelerator_mode": "cpu",
            "state_volume": "/var/lib/modelforge/agent-state",
            "image_source": "no_container",
        },
        timeout=10,
    ).json()
    assert answer["ok"] is False and [problem["field"] for problem in answer["problems"]] == ["control_plane_url"]
    console.log.assert_clean([ADMIN_TOKEN])


def test_the_wizards_node_month_figures_are_bench_cost_models() -> None:
    """The figures the wizard shows for a node-month (REST API, HTTP API) are the totals at the
    default 45 s interval of bench/README.md's table [2], which bench/cost.py prints."""
    table = (REPO / "bench" / "README.md").read_text()
    header = re.search(r"^\s+30 s REST\s+30 s HTTP\s+45 s REST\s+45 s HTTP.*$", table, re.M)
    total = re.search(
        r"^\s+total\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", table[header.end() :] if header else "", re.M
    )
    assert header is not None and total is not None
    rest, http = float(total.group(3)), float(total.group(4))
    shown = re.search(r'NODE_MONTH_USD = \{ rest: "([\d.]+)", http: "([\d.]+)" \}', ENROLL_JS.read_text())
    assert shown is not None
    assert (shown.group(1), shown.group(2)) == (f"{rest:.2f}", f"{http:.2f}")


DOMAIN = "https://modelforge.test"


def test_under_admin_on_a_custom_domain_the_node_origin_is_the_domains_root_on_the_http_api(
    console: Console,
) -> None:
    """Issue 21, first hour 6: DEPLOY.md's one domain (the console and admins under /admin on the
    REST API, the node routes at the root on the HTTP API). Here the browser's requests for
    https://modelforge.test/admin/... are served by the local stack at /...; the wizard locks the
    node's origin to the domain's root, the cheap path, and says so with its cost."""
    page = console.page

    def forward(route: Any) -> None:
        path = route.request.url.removeprefix(DOMAIN)
        if not path.startswith("/admin/"):
            route.fulfill(status=404, body="")
            return
        route.fulfill(response=route.fetch(url=console.url + path.removeprefix("/admin")))

    page.route(f"{DOMAIN}/**", forward)
    page.goto(f"{DOMAIN}/admin/console/")
    console.sign_in()
    wizard = console.open_wizard()
    expect(wizard.get_by_label("API origin")).to_have_value(DOMAIN)
    expect(wizard.get_by_text(f"Nodes use {DOMAIN}, this domain's root")).to_contain_text(
        "$0.18 per node-month on the HTTP API"
    )
    wizard.get_by_role("radiogroup", name="Image source").get_by_role("radio", name="No container").check()
    console.choose(wizard, name="Domain Node")
    token = console.create(wizard)
    settings = dict(line.split("=", 1) for line in console.block(wizard, "Generated .env").splitlines())
    assert settings["MODELFORGE_AGENT_CONTROL_PLANE_URL"] == DOMAIN
    console.screenshot("wizard-one-domain", mask=[wizard.get_by_label("One-time token")], mask_color="#8c959f")
    wizard.get_by_role("button", name="Revoke unused token").click()
    expect(wizard.get_by_role("button", name="Revoke unused token")).to_have_count(0)
    console.log.assert_clean([token, ADMIN_TOKEN])
