"""Domain errors carry no HTTP status: chalicelib/api/error_answers.py alone maps each kind to one."""

from __future__ import annotations

import inspect

import pytest
from chalicelib.api import error_answers as app
from chalicelib.domain import errors

KINDS = [
    kind
    for _, kind in inspect.getmembers(errors, inspect.isclass)
    if issubclass(kind, errors.DomainError) and kind is not errors.DomainError
]


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
def test_every_domain_error_kind_has_its_own_4xx_status(kind: type[errors.DomainError]) -> None:
    assert any(mapped is kind for mapped, _ in app.STATUS_OF), f"{kind.__name__} has no status in app.STATUS_OF"
    error = kind("some_code", "a message") if kind is not errors.RateLimited else kind("some_code", "m", 5)
    assert 400 <= app.http_status(error) < 500


def test_status_mapping_follows_the_domain() -> None:
    assert app.http_status(errors.TooLarge("payload_too_large", "m")) == 413  # before its parent, Invalid
    assert app.http_status(errors.invalid_request("m")) == 400
    assert app.http_status(errors.not_found("node")) == 404
    assert app.http_status(errors.RateLimited("inventory_rate_limited", "m", 0)) == 429


def test_no_domain_error_carries_an_http_status() -> None:
    error = errors.conflict("enrollment_revoked", "the token was already revoked")
    assert not hasattr(error, "status") and not hasattr(error, "headers")


def test_a_rate_limit_answer_carries_retry_after_in_the_body_and_the_header() -> None:
    response = app.error_response(errors.RateLimited("inventory_rate_limited", "slow down", 42))
    assert response.status_code == 429 and response.headers["Retry-After"] == "42"
    assert response.body["error"]["retry_after_seconds"] == 42
