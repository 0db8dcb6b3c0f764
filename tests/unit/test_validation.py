from __future__ import annotations

import json

import pytest
from chalicelib.api.paging import decode, encode
from chalicelib.domain.errors import DomainError, Invalid, TooLarge
from chalicelib.domain.validation import parse_json_object, validate


def test_validation_messages_name_fields_but_never_echo_values() -> None:
    secret = "mfe.enr_" + "0" * 32 + ".SECRETSECRETSECRETSECRETSECRETSECRETSECRE"
    with pytest.raises(DomainError) as error:
        validate({"display_name": secret * 10, "expires_in_seconds": "900", "extra_" + secret: 1}, "CREATE_ENROLLMENT")
    body = json.dumps(error.value.body())
    assert "display_name" in body and "expires_in_seconds" in body
    assert secret not in body
    assert isinstance(error.value, Invalid) and error.value.code == "invalid_request"


@pytest.mark.parametrize("raw", [b"[]", b"null", b'"x"', b"3"])
def test_parse_json_object_refuses_non_objects(raw: bytes) -> None:
    with pytest.raises(DomainError) as error:
        parse_json_object(raw)
    assert error.value.code == "invalid_request"


def test_parse_json_object_refuses_invalid_json_and_huge_bodies() -> None:
    with pytest.raises(DomainError) as error:
        parse_json_object(b"{not json")
    assert error.value.code == "invalid_json"
    with pytest.raises(DomainError) as error:
        parse_json_object(b"{" + b" " * 70000 + b"}")
    assert isinstance(error.value, TooLarge)


def test_page_tokens_round_trip_and_refuse_forgeries() -> None:
    key = {"node_id": {"S": "node_" + "a" * 32}}
    assert decode(encode(key), "node_id") == key
    for forged in ["!!!", encode({"node_id": {"S": "x"}}), encode({"other": {"S": "node_" + "a" * 32}})]:
        with pytest.raises(DomainError):
            decode(forged, "node_id")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"display_name": "\\ud800", "expires_in_seconds": 900}',
        b'{"display_name": "ok \\udfff tail"}',
        b'{"\\ud83d": 1}',
        b'{"inventory": {"gpus": [{"name": "\\ud800"}]}}',
    ],
)
def test_parse_json_object_lone_surrogate_is_refused_as_invalid_json(raw: bytes) -> None:
    with pytest.raises(DomainError) as error:
        parse_json_object(raw)
    assert isinstance(error.value, Invalid) and error.value.code == "invalid_json"


def test_parse_json_object_paired_surrogates_are_ordinary_text() -> None:
    assert parse_json_object(b'{"display_name": "GPU \\ud83d\\ude80"}') == {"display_name": "GPU \U0001f680"}


def test_parse_json_object_nested_at_the_body_depth_is_parsed_and_deeper_is_invalid_json() -> None:
    from modelforge_protocol.schemas import MAX_BODY_DEPTH

    at_limit = b'{"a":' + b"[" * (MAX_BODY_DEPTH - 1) + b"]" * (MAX_BODY_DEPTH - 1) + b"}"
    assert parse_json_object(at_limit)["a"] is not None
    with pytest.raises(Invalid) as refused:
        parse_json_object(b'{"a":' + b"[" * MAX_BODY_DEPTH + b"]" * MAX_BODY_DEPTH + b"}")
    assert (refused.value.code, refused.value.message) == ("invalid_json", "request body is not valid JSON")


def test_parse_json_object_number_beyond_a_float_is_invalid_json() -> None:
    with pytest.raises(Invalid) as refused:
        parse_json_object(b'{"a": 1e999}')
    assert refused.value.code == "invalid_json"


def test_paging_decode_deeply_nested_token_is_refused_not_a_crash() -> None:
    import base64

    token = base64.urlsafe_b64encode(b"[" * 50_000 + b"]" * 50_000).decode().rstrip("=")
    with pytest.raises(DomainError, match="next_token is not a token this API issued"):
        decode(token, "node_id")
