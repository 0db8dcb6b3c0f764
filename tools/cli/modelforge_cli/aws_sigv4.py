"""AWS SigV4 signing of admin API requests, for a stack deployed with ``AdminIamAuthorization=true``.

The credentials come from the standard AWS chain (environment, ``AWS_PROFILE`` and the shared
files, SSO, container and instance roles), through botocore; the region from the API's
``execute-api`` host name, else the chain (``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile).
A request is signed as the last step before it is sent (``requests`` calls the auth object with
the prepared request), so the signature covers exactly the method, URL, body and the headers it
names: ``host``, ``content-type``, the admin token header and ``x-amz-*`` (none of the hop-by-hop
or transport headers a proxy may rewrite).
"""

from __future__ import annotations

import os
import re
from typing import Any

import requests
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER

SERVICE = "execute-api"
ENV_VAR = "MODELFORGE_API_AWS_SIGV4"
#: ``<api id>.execute-api.<region>.amazonaws.com`` (or ``.amazonaws.com.cn``)
_EXECUTE_API_HOST = re.compile(r"^[a-z0-9]+\.execute-api\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
#: the request headers the signature covers (besides host and the x-amz-* headers it adds)
SIGNED_HEADERS = ("content-type", ADMIN_TOKEN_HEADER.lower())
NEEDS_EXTRA = (
    "--aws-sigv4 needs botocore, which the admin CLI's base install leaves out: pip install 'modelforge-cli[aws]'"
)


class SigningUnavailable(Exception):
    """No credentials or no region: the message is one line that says what to set."""


def wanted(flag: bool, environ: dict[str, str] | None = None) -> bool:
    """``--aws-sigv4``, or ``MODELFORGE_API_AWS_SIGV4`` set to 1/true/yes."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return flag or value.strip().lower() in ("1", "true", "yes")


def region_of(host: str) -> str | None:
    match = _EXECUTE_API_HOST.match(host.lower())
    return match.group(1) if match else None


class SigV4(requests.auth.AuthBase):
    """``requests`` auth that signs each request for ``execute-api`` in ``region``."""

    def __init__(self, credentials: Any, region: str) -> None:
        self.credentials = credentials
        self.region = region

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        signed = {name: value for name, value in request.headers.items() if name.lower() in SIGNED_HEADERS}
        body = request.body or b""
        aws = AWSRequest(method=request.method, url=request.url, data=body, headers=signed)
        # frozen: refreshable credentials (SSO, roles) are read once, consistently, per request
        SigV4Auth(self.credentials.get_frozen_credentials(), SERVICE, self.region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            if name in aws.headers:
                request.headers[name] = aws.headers[name]
        return request


def from_chain(api_url: str) -> SigV4:
    """Sign with the standard AWS credential chain; ``SigningUnavailable`` says what is missing."""
    from urllib.parse import urlsplit

    try:
        import botocore.session
    except ImportError:  # the base install: botocore comes with the [aws] extra
        raise SigningUnavailable(NEEDS_EXTRA) from None
    session = botocore.session.Session()
    try:
        credentials = session.get_credentials()
    except Exception as error:  # a broken profile, SSO session expired, ...
        raise SigningUnavailable(
            f"no usable AWS credentials for --aws-sigv4 ({type(error).__name__}: {error})"
        ) from None
    if credentials is None:
        raise SigningUnavailable(
            "no AWS credentials for --aws-sigv4: set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
            "or run `aws configure` / `aws sso login`"
        )
    region = (
        region_of(urlsplit(api_url).hostname or "")
        or session.get_config_variable("region")
        or os.environ.get("AWS_REGION")
    )
    if not region:
        raise SigningUnavailable(
            "no AWS region for --aws-sigv4: the API URL is not an execute-api host; "
            "set AWS_REGION to the stack's region"
        )
    return SigV4(credentials, region)
