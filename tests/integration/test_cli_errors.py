"""What every admin command shares, as a subprocess: the API URL, the CA and the admin token from
the environment or options, one line on stderr per failure (never a traceback, never the token),
and the documented exit codes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ADMIN_TOKEN
from tests.support.admin_cli import modelforge
from tests.support.api import ControlPlane
from tests.support.pki import write_server_pki
from tests.support.processes import RunningProcess, free_port, start_local_up

#: One read-only call of each command group.
READS = [("enrollments", "list"), ("nodes", "list"), ("work", "list"), ("nodes", "readiness", "node_" + "0" * 32)]


@pytest.mark.parametrize("args", READS, ids=lambda args: " ".join(args[:2]))
def test_without_the_admin_token_every_command_exits_2_saying_which_variable(
    remote: ControlPlane, args: tuple[str, ...]
) -> None:
    done = modelforge(None, *args, env={"MODELFORGE_API_URL": remote.base_url})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("modelforge: set MODELFORGE_ADMIN_TOKEN") and len(done.stderr.splitlines()) == 1
    # where the token is, not a claim that something prints it (dev-up never prints the token)
    assert 'export MODELFORGE_ADMIN_TOKEN="$(cat .modelforge/admin-token)"' in done.stderr
    assert "--admin-token-file" in done.stderr and "print" not in done.stderr


@pytest.mark.parametrize("args", READS, ids=lambda args: " ".join(args[:2]))
def test_a_wrong_admin_token_prints_the_apis_code_and_message(remote: ControlPlane, args: tuple[str, ...]) -> None:
    wrong = ControlPlane(remote.base_url, "w" * 43)
    done = modelforge(wrong, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert (
        "admin_token_invalid: the admin token is not valid" in done.stderr and "MODELFORGE_ADMIN_TOKEN" in done.stderr
    )
    assert len(done.stderr.splitlines()) == 1


def test_the_api_url_comes_from_the_option_or_the_environment(remote: ControlPlane) -> None:
    port = free_port()
    nowhere = f"http://127.0.0.1:{port}"
    by_option = modelforge(remote, "nodes", "list", "--api-url", nowhere)
    assert by_option.returncode == 2
    assert by_option.stderr.strip() == (
        f"modelforge: cannot reach {nowhere}: ConnectionError: is the control plane running there?"
        " (--api-url or MODELFORGE_API_URL)"
    )
    by_env = modelforge(remote, "work", "list", env={"MODELFORGE_API_URL": nowhere})
    assert by_env.returncode == 2 and f"cannot reach {nowhere}:" in by_env.stderr
    for bad in ("127.0.0.1:8000", "ftp://127.0.0.1"):
        done = modelforge(remote, "nodes", "list", "--api-url", bad)
        assert done.returncode == 2 and "the API URL must be http://host[:port] or https://host[:port]" in done.stderr


def test_a_missing_ca_file_is_a_configuration_error(remote: ControlPlane, tmp_path: Path) -> None:
    missing = str(tmp_path / "none.pem")
    for args, env in ((("--ca-cert", missing), {}), ((), {"MODELFORGE_CA_CERT_PATH": missing})):
        done = modelforge(remote, "nodes", "list", *args, env=env)
        assert done.returncode == 2 and f"no such CA certificate file: {missing}" in done.stderr


@pytest.fixture(scope="module")
def tls_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProcess, Path]]:
    folder = tmp_path_factory.mktemp("cli-tls")
    cert, key, ca = write_server_pki(folder, "127.0.0.1")
    with start_local_up(
        folder / "local-up.log",
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN},
    ) as running:
        yield running, ca


def test_https_with_the_private_ca_from_the_option_or_the_environment(tls_plane: tuple[RunningProcess, Path]) -> None:
    running, ca = tls_plane
    cp = ControlPlane(running.api_url, ADMIN_TOKEN, verify=str(ca))
    assert running.api_url.startswith("https://")
    untrusted = modelforge(cp, "nodes", "list")
    assert untrusted.returncode == 2
    assert (
        f"cannot reach {running.api_url}: SSLError: the TLS handshake failed: check --ca-cert/MODELFORGE_CA_CERT_PATH"
        in untrusted.stderr
    )
    by_option = modelforge(cp, "enrollments", "create", "--ca-cert", str(ca))
    assert by_option.returncode == 0, by_option.stderr
    assert f"MODELFORGE_AGENT_CA_CERT_PATH={ca.resolve()}" in by_option.stdout
    by_env = modelforge(cp, "enrollments", "list", env={"MODELFORGE_CA_CERT_PATH": str(ca)})
    assert by_env.returncode == 0 and "pending" in by_env.stdout


def test_https_to_a_plain_http_server_says_to_check_that_it_serves_https(remote: ControlPlane) -> None:
    https = remote.base_url.replace("http://", "https://")
    done = modelforge(remote, "nodes", "list", "--api-url", https)
    assert done.returncode == 2 and "SSLError" in done.stderr and "serves HTTPS" in done.stderr


def test_usage_errors_exit_2_and_every_help_exits_0(remote: ControlPlane) -> None:
    for usage in (("nodes",), ("enrollments", "show"), ("work", "result"), ("nodes", "list", "--bogus")):
        done = modelforge(remote, *usage)
        assert done.returncode == 2 and "usage: modelforge" in done.stderr
    for command in ((), ("enrollments",), ("nodes", "revoke-credential"), ("work", "submit")):
        done = modelforge(None, *command, "--help")
        assert done.returncode == 0 and done.stdout.startswith("usage: modelforge")
        if command:
            assert "exit codes:" in done.stdout and "MODELFORGE_ADMIN_TOKEN" in done.stdout


def test_the_missing_token_message_names_the_file_dev_up_keeps_the_token_in() -> None:
    from modelforge_cli.admin_api import DEV_UP_TOKEN_FILE

    dev_up = (Path(__file__).resolve().parents[2] / "scripts" / "dev-up").read_text()
    assert f"--admin-token-file {DEV_UP_TOKEN_FILE} " in dev_up
