"""The admin API as the `modelforge` commands call it: where it is (`MODELFORGE_API_URL` or
`--api-url`), how to trust it (`--ca-cert` or `MODELFORGE_CA_CERT_PATH`), the admin token
(`MODELFORGE_ADMIN_TOKEN` only: never an argument, never printed), and what a failure means for
the exit code. Every failure is a `CommandFailed` with one line to print, never a traceback."""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import requests
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER

from . import aws_sigv4

#: The documented exit codes of the admin commands.
EXIT_OK = 0
EXIT_NO = 1  # not ready, not found, no result yet, or declined: the answer, not an error
EXIT_ERROR = 2  # usage or configuration error, unreachable API, or any other API refusal

DEFAULT_API_URL = "http://127.0.0.1:8000"
API_URL_VAR = "MODELFORGE_API_URL"
TOKEN_VAR = "MODELFORGE_ADMIN_TOKEN"
CA_CERT_VAR = "MODELFORGE_CA_CERT_PATH"
#: Where the token is: dev-up keeps it in the checkout's .modelforge/admin-token (it never prints
#: it), local up in its --admin-token-file, a deployed stack's admin in a secret manager.
DEV_UP_TOKEN_FILE = ".modelforge/admin-token"
MISSING_TOKEN = (
    f"set {TOKEN_VAR} to the control plane's admin token: ./scripts/dev-up keeps it in {DEV_UP_TOKEN_FILE} in "
    f'the checkout (export {TOKEN_VAR}="$(cat {DEV_UP_TOKEN_FILE})"), modelforge local up in its '
    "--admin-token-file; for a deployed stack, the token you made with modelforge admin-token new"
)
REQUEST_TIMEOUT_SECONDS = 30
PAGE_LIMIT = 100


EXIT_CODES_HELP = """\
exit codes:
  0  done (readiness: the node is ready)
  1  the answer is no: not ready, no such id (show, revoke, cancel, result), no result yet, or declined
  2  usage or configuration error, unreachable API, or any other API refusal (code and message on stderr)

environment: MODELFORGE_ADMIN_TOKEN (required), MODELFORGE_API_URL, MODELFORGE_CA_CERT_PATH,
  MODELFORGE_API_AWS_SIGV4 (with AWS credentials and region from the standard AWS chain)
"""


def add_command(
    commands: Any, name: str, *, help: str, description: str, epilog: str = EXIT_CODES_HELP
) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with ``epilog``: by default the exit codes and the environment
    the admin commands read."""
    return commands.add_parser(  # type: ignore[no-any-return]
        name,
        help=help,
        description=textwrap.fill(description, width=100),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


class CommandFailed(Exception):
    """One line for stderr (without the `modelforge: ` prefix) and the exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class ApiRefused(CommandFailed):
    """The API answered with an error: its status, code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        text = f"{code}: {message}" if message else code
        if code in ("admin_token_missing", "admin_token_invalid"):
            text += f" (set {TOKEN_VAR} to the control plane's admin token)"
        super().__init__(text, EXIT_ERROR)
        self.status = status
        self.code = code

    @property
    def not_found(self) -> bool:
        return self.status == 404


def add_connection_options(
    parser: argparse.ArgumentParser,
    json_help: str = "print the API's JSON answer (for scripts) instead of readable text",
    *,
    with_json: bool = True,
) -> None:
    """The options every admin command takes (and `--json`, where the output is the API's answer)."""
    group = parser.add_argument_group("control plane")
    group.add_argument(
        "--api-url",
        metavar="URL",
        help=f"the control plane's API (default ${API_URL_VAR}, else {DEFAULT_API_URL}); "
        f"the admin token is read from ${TOKEN_VAR}, never from an argument",
    )
    group.add_argument(
        "--ca-cert",
        metavar="FILE",
        help=f"PEM of the private CA that signed the API's certificate (default ${CA_CERT_VAR}; "
        "the system trust store otherwise)",
    )
    group.add_argument(
        "--aws-sigv4",
        action="store_true",
        help=f"sign each request with AWS SigV4 (service execute-api) using the standard AWS credential chain and "
        f"region: for a stack deployed with AdminIamAuthorization=true (default ${aws_sigv4.ENV_VAR}=1); "
        "the admin token is sent as well",
    )
    if with_json:
        parser.add_argument("--json", action="store_true", help=json_help)


def segment(value: str) -> str:
    """An id as one URL path segment, whatever it contains."""
    return quote(value, safe="")


@dataclass
class AdminApi:
    api_url: str
    token: str = field(repr=False)
    ca_cert: str | None = None
    session: requests.Session = field(default_factory=requests.Session, repr=False)
    #: SigV4 signing (--aws-sigv4), or None
    auth: requests.auth.AuthBase | None = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AdminApi:
        """The API from the command's options and the environment; configuration errors exit 2."""
        api_url = (getattr(args, "api_url", None) or os.environ.get(API_URL_VAR) or DEFAULT_API_URL).strip().rstrip("/")
        parts = urlsplit(api_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CommandFailed(
                f"the API URL must be http://host[:port] or https://host[:port], not {api_url!r}"
                f" (--api-url or {API_URL_VAR})"
            )
        ca_cert = getattr(args, "ca_cert", None) or os.environ.get(CA_CERT_VAR) or None
        if ca_cert is not None and not Path(ca_cert).is_file():
            raise CommandFailed(f"no such CA certificate file: {ca_cert} (--ca-cert or {CA_CERT_VAR})")
        token = os.environ.get(TOKEN_VAR, "")
        if not token:
            raise CommandFailed(MISSING_TOKEN)
        if not token.isascii() or not token.isprintable() or any(char.isspace() for char in token):
            raise CommandFailed(
                f"{TOKEN_VAR} holds characters an HTTP header cannot carry (spaces, control or non-ASCII characters)"
            )
        auth = None
        if aws_sigv4.wanted(bool(getattr(args, "aws_sigv4", False))):
            try:
                auth = aws_sigv4.from_chain(api_url)
            except aws_sigv4.SigningUnavailable as error:
                raise CommandFailed(str(error)) from None
        return cls(api_url, token, ca_cert, auth=auth)

    def call(
        self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """The status and the decoded answer of a 2xx; `ApiRefused` for an error answer."""
        url = self.api_url + path
        try:
            response = self.session.request(
                method,
                url,
                json=json,
                params=params,
                headers={ADMIN_TOKEN_HEADER: self.token},
                auth=self.auth,
                timeout=REQUEST_TIMEOUT_SECONDS,
                verify=self.ca_cert or True,
                allow_redirects=False,
            )
        except requests.RequestException as error:
            raise CommandFailed(unreachable(self.api_url, error)) from None
        try:
            answer = response.json() if response.content else None
        except ValueError:
            answer = None
        if 200 <= response.status_code < 300:
            if answer is None and response.status_code != 204:
                raise CommandFailed(
                    f"HTTP {response.status_code} from {self.api_url} is not a ModelForge API answer (no JSON)"
                )
            return response.status_code, answer
        refusal = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(refusal, dict) and isinstance(refusal.get("code"), str):
            raise ApiRefused(response.status_code, refusal["code"], str(refusal.get("message") or ""))
        if 300 <= response.status_code < 400:
            raise CommandFailed(
                f"HTTP {response.status_code} redirect from {self.api_url} (not followed): "
                "set the API URL to the address that serves the API itself"
            )
        raise CommandFailed(f"HTTP {response.status_code} from {self.api_url} is not a ModelForge API answer")

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        return self.call("GET", path, params=params)[1]

    def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        return self.call("POST", path, json=body if body is not None else {})

    def pages(self, path: str, key: str, params: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """Every item of a listing, following `next_token` to the last page."""
        query = {**(params or {}), "limit": str(PAGE_LIMIT)}
        while True:
            page = self.get(path, query)
            if not isinstance(page, dict) or not isinstance(page.get(key), list):
                raise CommandFailed(f"the answer of GET {path} has no {key!r} list")
            yield from page[key]
            token = page.get("next_token")
            if not token:
                return
            query = {**query, "next_token": str(token)}


def unreachable(api_url: str, error: requests.RequestException) -> str:
    """One line naming the URL, the error class and what to check."""
    name = type(error).__name__
    if isinstance(error, requests.exceptions.SSLError):
        hint = (
            f"the TLS handshake failed: check --ca-cert/{CA_CERT_VAR} (the CA that signed the API's certificate) "
            "and that the server serves HTTPS on this port"
        )
    elif isinstance(error, requests.exceptions.Timeout):
        hint = f"no answer within {REQUEST_TIMEOUT_SECONDS} s"
    elif isinstance(error, requests.exceptions.ConnectionError):
        hint = f"is the control plane running there? (--api-url or {API_URL_VAR})"
    else:
        hint = "the request could not be made"
    return f"cannot reach {api_url}: {name}: {hint}"
