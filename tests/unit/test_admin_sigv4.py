"""`--aws-sigv4`: the admin commands sign their requests for API Gateway's IAM authorization
(service execute-api) with the standard AWS credential chain, and still send the admin token.

A local HTTP server records what actually goes on the wire; the signature is then recomputed from
those bytes with AWS's SigV4 algorithm written out here (not botocore's), with fixed credentials
and a fixed clock, so it is what API Gateway would compute."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import pytest
from botocore.credentials import Credentials
from modelforge_cli import aws_sigv4, cli
from modelforge_cli.admin_api import AdminApi, CommandFailed
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER

ACCESS_KEY, SECRET_KEY, SESSION_TOKEN = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "FQoGZXIvYXdzEXAMPLE"
FIXED = datetime.datetime(2026, 3, 14, 15, 9, 26)
TOKEN = "t" * 43


@pytest.fixture()
def server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP server that records each request and answers an empty node listing."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen.append(
                {
                    "method": self.command,
                    "target": self.path,
                    "headers": dict(self.headers.items()),
                    "body": self.rfile.read(length),
                }
            )
            body = json.dumps({"nodes": [], "next_token": None}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _record

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/api", seen
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture()
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import botocore.auth

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *args, **kwargs: FIXED)


@pytest.fixture()
def no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Nothing of the developer's AWS setup, and no instance metadata lookups."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_") or name == aws_sigv4.ENV_VAR:
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _sign(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def expected_signature(request: dict[str, Any], region: str) -> tuple[str, dict[str, str]]:
    """SigV4 of the recorded request, from the algorithm's definition; also the parsed header."""
    authorization = request["headers"]["Authorization"]
    algorithm, _, fields = authorization.partition(" ")
    assert algorithm == "AWS4-HMAC-SHA256"
    parts = dict(field.strip().split("=", 1) for field in fields.split(","))
    signed_names = parts["SignedHeaders"].split(";")
    headers = {name.lower(): value for name, value in request["headers"].items()}
    target = urlsplit(request["target"])
    query = sorted(
        (quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in parse_qsl(target.query, keep_blank_values=True)
    )
    canonical = "\n".join(
        [
            request["method"],
            quote(target.path, safe="/~"),  # the path as sent, encoded once more (every service but S3)
            "&".join(f"{k}={v}" for k, v in query),
            "".join(f"{name}:{' '.join(headers[name].split())}\n" for name in signed_names),
            ";".join(signed_names),
            hashlib.sha256(request["body"]).hexdigest(),
        ]
    )
    stamp = headers["x-amz-date"]
    scope = f"{stamp[:8]}/{region}/execute-api/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _sign(_sign(_sign(_sign(("AWS4" + SECRET_KEY).encode(), stamp[:8]), region), "execute-api"), "aws4_request")
    assert parts["Credential"] == f"{ACCESS_KEY}/{scope}"
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), parts


def signed_api(url: str, region: str = "eu-west-1", token: str | None = None) -> AdminApi:
    credentials = Credentials(ACCESS_KEY, SECRET_KEY, token)
    return AdminApi(url, TOKEN, auth=aws_sigv4.SigV4(credentials, region))


def test_a_signed_get_carries_a_valid_execute_api_signature_and_the_admin_token(
    server: tuple[str, list[dict[str, Any]]], fixed_clock: None
) -> None:
    url, seen = server
    signed_api(url).get("/api/v1/admin/nodes", {"limit": "100", "next_token": "eyJub2RlX2lkIjogIm4ifQ=="})
    (request,) = seen
    signature, parts = expected_signature(request, "eu-west-1")
    assert parts["Signature"] == signature
    assert request["headers"]["X-Amz-Date"] == "20260314T150926Z"
    assert request["headers"][ADMIN_TOKEN_HEADER] == TOKEN
    assert {"host", "x-amz-date", ADMIN_TOKEN_HEADER.lower()} <= set(parts["SignedHeaders"].split(";"))


def test_a_signed_post_covers_its_body_content_type_and_session_token(
    server: tuple[str, list[dict[str, Any]]], fixed_clock: None
) -> None:
    url, seen = server
    signed_api(url, "us-east-2", SESSION_TOKEN).post("/api/v1/admin/nodes/node_1/revoke-credential", {"why": "test"})
    (request,) = seen
    signature, parts = expected_signature(request, "us-east-2")
    assert parts["Signature"] == signature and request["body"] == b'{"why": "test"}'
    assert request["headers"]["X-Amz-Security-Token"] == SESSION_TOKEN
    assert {"content-type", "x-amz-security-token"} <= set(parts["SignedHeaders"].split(";"))
    # nothing a proxy may rewrite is signed
    assert not {"connection", "accept-encoding", "user-agent", "content-length"} & set(
        parts["SignedHeaders"].split(";")
    )


def test_without_the_flag_or_the_variable_nothing_is_signed(
    server: tuple[str, list[dict[str, Any]]], no_aws_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = server
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", TOKEN)
    AdminApi.from_args(argparse.Namespace(api_url=url, aws_sigv4=False)).get("/api/v1/admin/nodes")
    assert "Authorization" not in seen[0]["headers"] and seen[0]["headers"][ADMIN_TOKEN_HEADER] == TOKEN


def test_the_variable_turns_signing_on_with_the_chain_s_credentials_and_the_host_s_region(
    no_aws_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv(aws_sigv4.ENV_VAR, "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    api = AdminApi.from_args(
        argparse.Namespace(api_url="https://abc123defg.execute-api.eu-central-1.amazonaws.com/api")
    )
    assert isinstance(api.auth, aws_sigv4.SigV4) and api.auth.region == "eu-central-1"
    assert api.auth.credentials.get_frozen_credentials().access_key == ACCESS_KEY
    custom = AdminApi.from_args(argparse.Namespace(api_url="https://admin.example.com", aws_sigv4=True))
    assert isinstance(custom.auth, aws_sigv4.SigV4) and custom.auth.region == "us-west-2"


def test_a_custom_domain_without_a_region_is_one_clear_line(
    no_aws_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    with pytest.raises(CommandFailed, match="no AWS region for --aws-sigv4"):
        AdminApi.from_args(argparse.Namespace(api_url="https://admin.example.com", aws_sigv4=True))


def test_no_credentials_is_one_line_and_exit_2(
    no_aws_environment: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", TOKEN)
    code = cli.main(
        ["nodes", "list", "--aws-sigv4", "--api-url", "https://abc123defg.execute-api.us-east-1.amazonaws.com/api"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("modelforge: no AWS credentials for --aws-sigv4")


def test_aws_sigv4_without_botocore_is_one_line_naming_the_aws_extra_and_exit_2(
    no_aws_environment: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The admin CLI's base install has no botocore: `--aws-sigv4` then says which extra brings it."""
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", TOKEN)
    monkeypatch.setitem(sys.modules, "botocore.session", None)  # import raises ImportError
    code = cli.main(
        ["nodes", "list", "--aws-sigv4", "--api-url", "https://abc123defg.execute-api.us-east-1.amazonaws.com/api"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"modelforge: {aws_sigv4.NEEDS_EXTRA}\n"
    assert "pip install 'modelforge-cli[aws]'" in err
