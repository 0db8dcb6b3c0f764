from __future__ import annotations

from pathlib import Path

import pytest
from modelforge_node_agent.config import INSECURE_SWITCH, load_config
from modelforge_node_agent.exit_codes import CONFIGURATION_INVALID, exit_for
from modelforge_node_agent.failures import ConfigurationInvalid

TOKEN = "mfe.enr_" + "0" * 32 + "." + "A" * 43


def _env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    env = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.internal:8443",
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
        "MODELFORGE_AGENT_HOSTNAME": "gpu_node",
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
    }
    env.update(overrides)
    return {key: value for key, value in env.items() if value is not None}


def _problems(env: dict[str, str]) -> str:
    with pytest.raises(ConfigurationInvalid) as error:
        load_config(env)
    assert exit_for(error.value).code == CONFIGURATION_INVALID
    return str(error.value)


def test_config_valid_environment_loads_with_safe_defaults(tmp_path: Path) -> None:
    config = load_config(_env(tmp_path))
    assert config.tls_verify is True and config.identity_mode == "persisted"
    assert TOKEN not in repr(config)


def test_config_placeholder_url_is_refused_with_a_hint(tmp_path: Path) -> None:
    message = _problems(_env(tmp_path, MODELFORGE_AGENT_CONTROL_PLANE_URL="https://modelforge.example.internal:8000"))
    assert "placeholder" in message and "real address" in message


@pytest.mark.parametrize(
    "url", ["http://10.0.0.5:8000", "http://cp.internal", "ftp://cp", "cp.internal", "https://cp/x"]
)
def test_config_non_https_or_odd_urls_are_refused(tmp_path: Path, url: str) -> None:
    assert "MODELFORGE_AGENT_CONTROL_PLANE_URL" in _problems(_env(tmp_path, MODELFORGE_AGENT_CONTROL_PLANE_URL=url))


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"])
def test_config_plain_http_is_allowed_for_loopback(tmp_path: Path, url: str) -> None:
    assert load_config(_env(tmp_path, MODELFORGE_AGENT_CONTROL_PLANE_URL=url)).control_plane_url == url


def test_config_tls_verify_false_is_refused_without_the_insecure_switch(tmp_path: Path) -> None:
    message = _problems(_env(tmp_path, MODELFORGE_AGENT_TLS_VERIFY="false"))
    assert "MODELFORGE_AGENT_TLS_VERIFY" in message and INSECURE_SWITCH in message
    config = load_config(_env(tmp_path, MODELFORGE_AGENT_TLS_VERIFY="false", **{INSECURE_SWITCH: "true"}))
    assert config.tls_verify is False


def test_config_every_bad_variable_is_named_and_the_token_never_printed(tmp_path: Path) -> None:
    bad_token = "mfe.not-a-token-but-secret-" + "Z" * 30
    message = _problems(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": "",
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": bad_token,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "tpu",
            "MODELFORGE_AGENT_HOSTNAME": "bad host",
            "MODELFORGE_AGENT_IDENTITY_MODE": "ephemeral",
            "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": "soon",
            "MODELFORGE_AGENT_CA_CERT_PATH": str(tmp_path / "missing.pem"),
        }
    )
    for name in (
        "MODELFORGE_AGENT_CONTROL_PLANE_URL",
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN",
        "MODELFORGE_AGENT_ACCELERATOR_MODE",
        "MODELFORGE_AGENT_HOSTNAME",
        "MODELFORGE_AGENT_STATE_VOLUME",
        "MODELFORGE_AGENT_IDENTITY_MODE",
        "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS",
        "MODELFORGE_AGENT_CA_CERT_PATH",
    ):
        assert name in message
    assert bad_token not in message


def test_config_ca_file_must_hold_a_pem_certificate(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("hello")
    assert "PEM" in _problems(_env(tmp_path, MODELFORGE_AGENT_CA_CERT_PATH=str(not_pem)))


def test_config_without_token_and_without_identity_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    message = _problems(_env(tmp_path, MODELFORGE_AGENT_ENROLLMENT_TOKEN=""))
    assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN is required: this node has no identity yet" in message
    assert not (tmp_path / "state").exists()


def test_config_without_token_is_valid_once_an_identity_file_exists(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "identity.json").write_text("{}")  # its contents are checked when it is loaded
    assert load_config(_env(tmp_path, MODELFORGE_AGENT_ENROLLMENT_TOKEN="")).enrollment_token is None


@pytest.mark.parametrize(
    "name", ["MODELFORGE_AGENT_ACCELERATOR_MODE", "MODELFORGE_AGENT_LOG_LEVEL", "MODELFORGE_AGENT_IDENTITY_MODE"]
)
def test_config_blank_choice_is_refused_not_defaulted(name: str) -> None:
    with pytest.raises(ConfigurationInvalid, match=name):
        load_config({"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.example.com", name: " "})


@pytest.mark.parametrize(
    "proxy",
    ["http://proxy.internal:3128", "https://proxy.internal", "http://user:pa%40ss@10.0.0.9:8080/"],
)
def test_config_https_proxy_takes_an_http_or_https_url(tmp_path: Path, proxy: str) -> None:
    config = load_config(_env(tmp_path, MODELFORGE_AGENT_HTTPS_PROXY=proxy))
    assert config.https_proxy == proxy.rstrip("/")
    assert "pa%40ss" not in repr(config)
    assert load_config(_env(tmp_path)).https_proxy is None


@pytest.mark.parametrize(
    "proxy",
    [
        "proxy.internal:3128",
        "socks5://proxy.internal:1080",
        "http://",
        "http://proxy.internal:99999",
        "http://proxy.internal:3128/path",
        "http://proxy.internal:3128?x=1",
        "http://secret-user@proxy.internal:3128",
    ],
)
def test_config_https_proxy_refuses_other_values_without_echoing_them(tmp_path: Path, proxy: str) -> None:
    message = _problems(_env(tmp_path, MODELFORGE_AGENT_HTTPS_PROXY=proxy))
    assert "MODELFORGE_AGENT_HTTPS_PROXY must be http://host:port" in message
    assert "secret-user" not in message and "proxy.internal" not in message
