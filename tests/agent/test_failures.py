"""``failures.classify``: the one place that says what a control-plane failure means to a caller."""

from __future__ import annotations

import pytest
from modelforge_node_agent.failures import (
    REDIRECT,
    Kind,
    RedirectRefused,
    Refused,
    TransientFailure,
    classify,
)

PATH = "/api/v1/agent/work/claim"


def _refused(status: int, code: str) -> Refused:
    return Refused(status, code, "POST", PATH, None, None)


def test_classify_transient_failure_is_transient_and_named_by_its_label() -> None:
    failure = classify(TransientFailure("HTTP 503", "POST", PATH, status=503))
    assert (failure.kind, failure.code, failure.status, failure.path) == (Kind.TRANSIENT, "HTTP 503", 503, PATH)


def test_classify_transient_failure_without_a_status_keeps_none() -> None:
    failure = classify(TransientFailure("ConnectError", "POST", PATH))
    assert (failure.kind, failure.code, failure.status) == (Kind.TRANSIENT, "ConnectError", None)


@pytest.mark.parametrize("status", [401, 403])
def test_classify_refused_credential_is_fatal(status: int) -> None:
    error = _refused(status, "credential_revoked")
    failure = classify(error)
    assert (failure.kind, failure.code, failure.status, failure.error) == (
        Kind.FATAL,
        "credential_revoked",
        status,
        error,
    )


@pytest.mark.parametrize(("status", "code"), [(409, "lease_lost"), (409, "node_not_online"), (400, "invalid_body")])
def test_classify_other_refusals_are_the_calls_answer(status: int, code: str) -> None:
    failure = classify(_refused(status, code))
    assert (failure.kind, failure.code, failure.status) == (Kind.REFUSED, code, status)


def test_classify_redirect_is_fatal_and_goes_by_redirect() -> None:
    error = RedirectRefused(307, "POST", PATH)
    failure = classify(error)
    assert (failure.kind, failure.code, failure.status, failure.path, failure.error) == (
        Kind.FATAL,
        REDIRECT,
        307,
        PATH,
        error,
    )


def test_classify_anything_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="ValueError"):
        classify(ValueError("a bug"))
