"""What the agent takes from its environment: nothing. A ``~/.netrc`` (or ``$NETRC``) with a
credential for the control plane's and the object host's address never becomes an
``Authorization: Basic`` header; ``HTTPS_PROXY`` and the like are never used. The one proxy is
``MODELFORGE_AGENT_HTTPS_PROXY``, and every https:// and wss:// connection tunnels through it: the
control plane, presigned objects and the push channel. Real servers and a real CONNECT proxy on
127.0.0.1."""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme
from modelforge_node_agent import channel
from modelforge_node_agent.channel_link import LinkFailed, WebSocketOpener, tls_context
from modelforge_node_agent.config import AgentConfig, load_config
from modelforge_node_agent.control_plane import HEARTBEAT, ControlPlaneClient
from modelforge_node_agent.identity import Identity, StateVolume
from modelforge_node_agent.transport import base_url, build_object_session, build_session
from modelforge_node_agent.work.transfers import PresignedObjects

from tests.agent.channel_server import ChannelServer, poll
from tests.agent.channel_support import NODE_ID, WALL_AT_ZERO, channel_block, ticket_secret
from tests.agent.connect_proxy import ConnectProxy
from tests.agent.fake_control_plane import TOKEN, FakeServer, ObjectServer, enrolled_before

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture
def netrc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A netrc in HOME and in $NETRC with a login for 127.0.0.1 (and a default one)."""
    home = tmp_path / "home"
    home.mkdir()
    netrc = home / ".netrc"
    netrc.write_text("machine 127.0.0.1 login netrc-user password netrc-secret\ndefault login any password other\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    ca = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(served)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return {"served": served, "ca": tmp_path / "ca.pem"}


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    running = ConnectProxy()
    try:
        yield running
    finally:
        running.close()


def _config(tmp_path: Path, url: str, **env: str) -> AgentConfig:
    return load_config(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": url,
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
            **env,
        }
    )


def _heartbeat(config: AgentConfig) -> Identity:
    """One heartbeat as the agent sends it (its session, its client, an enrolled identity)."""
    state = StateVolume(config.state_volume)
    state.prepare()
    enrolled_before(state, config.control_plane_url)
    identity = state.load()
    assert identity is not None
    client = ControlPlaneClient(build_session(config), base_url(config), config.request_timeout_seconds)
    client.post(HEARTBEAT, {"node_id": NODE_ID}, identity)
    return identity


@contextlib.contextmanager
def _server(**options: Any) -> Iterator[FakeServer]:
    server = FakeServer({}, **options)
    try:
        yield server
    finally:
        server.close()


def test_netrc_never_replaces_the_bearer_credential_on_control_plane_requests(tmp_path: Path, netrc: Path) -> None:
    with _server() as plane:
        identity = _heartbeat(_config(tmp_path, plane.url))
        (seen,) = plane.seen
    assert seen.headers["Authorization"] == f"Bearer {identity.credential}"


def test_netrc_credentials_never_reach_the_object_host(tmp_path: Path, netrc: Path) -> None:
    objects = ObjectServer()
    try:
        objects.objects["in.json"] = b"{}"
        transfers = PresignedObjects(build_object_session(_config(tmp_path, "http://127.0.0.1:9")), 5.0)
        assert transfers.get(objects.url("in.json"), "input", 1024) == b"{}"
        transfers.put(objects.url("out.json"), "result", b"{}")
    finally:
        objects.close()
    assert [request.method for request in objects.requests] == ["GET", "PUT"]
    assert all("Authorization" not in request.headers for request in objects.requests)


def test_environment_proxies_are_never_used(
    tmp_path: Path, pki: dict[str, Any], proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with _server(tls=pki["served"]) as plane, contextlib.closing(ChannelServer(tls=pki["served"])) as channel_plane:
        config = _config(tmp_path, plane.url, MODELFORGE_AGENT_CA_CERT_PATH=str(pki["ca"]))
        _heartbeat(config)
        _open_channel(config, channel_plane)
        assert len(plane.seen) == 1
        ours = (urlsplit(plane.url).netloc, urlsplit(channel_plane.url).netloc)
    # none of the agent's connections went through it (other programs on the machine may read the
    # variables meanwhile: a CI run once saw a stray CONNECT to a telemetry host)
    assert [request.line for request in proxy.requests if request.line.split(" ")[1] in ours] == []


def test_the_configured_proxy_carries_the_control_plane_and_the_channel(
    tmp_path: Path, pki: dict[str, Any], proxy: ConnectProxy
) -> None:
    with _server(tls=pki["served"]) as plane, contextlib.closing(ChannelServer(tls=pki["served"])) as channel_plane:
        config = _config(
            tmp_path,
            plane.url,
            MODELFORGE_AGENT_CA_CERT_PATH=str(pki["ca"]),
            MODELFORGE_AGENT_HTTPS_PROXY=proxy.url,
        )
        _heartbeat(config)
        _open_channel(config, channel_plane)
        assert len(plane.seen) == 1 and len(channel_plane.connections) == 1
        plane_port, channel_port = plane.url.rsplit(":", 1)[1], channel_plane.port
    assert proxy.connects == [f"127.0.0.1:{plane_port}", f"127.0.0.1:{channel_port}"]
    objects = build_object_session(config)  # presigned transfers: the same one proxy, for https:// only
    assert objects.proxies == {"https": proxy.url} and objects.trust_env is False


def test_a_proxy_that_refuses_the_tunnel_is_named_without_its_address(
    tmp_path: Path, pki: dict[str, Any], proxy: ConnectProxy
) -> None:
    refusing = f"http://user:proxy-secret@127.0.0.1:{proxy.url.rsplit(':', 1)[1]}"
    opener = WebSocketOpener(tls_context(pki["ca"]), open_seconds=5.0, proxy=refusing)
    with pytest.raises(LinkFailed) as failed, opener("wss://127.0.0.1:9/api/v1/agent/channel", NODE_ID, "t"):
        pass
    assert failed.value.reason == "the proxy refused the tunnel (HTTP 502)"
    assert proxy.requests[0].headers["Proxy-Authorization"].startswith("Basic ")


def _open_channel(config: AgentConfig, plane: ChannelServer) -> None:
    """The agent's channel as ``channel.for_config`` builds it, offered a ticket for ``plane``."""
    link = channel.for_config(config)
    link.start(NODE_ID, on_wake=lambda: None, on_cancel=lambda _work_id: None)
    try:
        link.offer(channel_block(ticket_secret(1), time.time() - WALL_AT_ZERO, url=plane.url))
        poll(lambda: plane.connections)
    finally:
        link.close(grace_seconds=3.0)
