from __future__ import annotations

import hashlib
import secrets

import pytest
from chalicelib.config import resources
from chalicelib.config.settings import SettingsError, admin_token_weakness, load_settings

TOKEN = secrets.token_urlsafe(32)
BASE = {
    **resources.local_names("unit"),
    "MODELFORGE_ADMIN_TOKEN": TOKEN,
    # the documented defaults (infra PARAMETERS, scripts/dev-up)
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": "90",
    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
}


def test_settings_defaults_are_valid_with_an_admin_token() -> None:
    settings = load_settings(BASE)
    assert settings.heartbeat_interval_seconds == 45
    assert settings.stale_after_seconds < settings.offline_after_seconds
    assert settings.admin_token_sha256 == hashlib.sha256(TOKEN.encode()).hexdigest()


def test_settings_defaults_make_a_silent_node_stale_within_90_seconds_but_not_after_one_lost_heartbeat() -> None:
    """Issue 19: stale within 90 s of silence; a failed heartbeat is retried within the agent's
    request timeout (10 s) and backoff (at most 16 s), so one failure never makes an on-time node
    stale."""
    settings = load_settings(BASE)
    assert settings.stale_after_seconds <= 90
    assert settings.heartbeat_interval_seconds + 10 + 16 < settings.stale_after_seconds
    assert 2 * settings.heartbeat_interval_seconds <= settings.stale_after_seconds


def test_settings_accept_only_the_admin_token_digest() -> None:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert (
        load_settings(
            {**BASE, "MODELFORGE_ADMIN_TOKEN": "", "MODELFORGE_ADMIN_TOKEN_SHA256": digest}
        ).admin_token_sha256
        == digest
    )


def test_settings_repr_never_shows_the_admin_token_digest() -> None:
    settings = load_settings(BASE)
    assert settings.admin_token_sha256 not in repr(settings)


@pytest.mark.parametrize(
    ("stale", "offline"),
    [
        ("60", "60"),
        ("60", "59"),
        ("300", "60"),
        (None, "300"),
        ("60", None),
        ("sixty", "300"),
        ("60", "1.5"),
        ("0", "300"),
        ("-60", "300"),
        ("60", "-300"),
        ("", "300"),
    ],
)
def test_settings_invalid_liveness_thresholds_are_refused_naming_both(stale: str | None, offline: str | None) -> None:
    env = {"MODELFORGE_ADMIN_TOKEN": TOKEN}
    for name, value in (
        ("MODELFORGE_NODE_STALE_AFTER_SECONDS", stale),
        ("MODELFORGE_NODE_OFFLINE_AFTER_SECONDS", offline),
    ):
        if value is not None:
            env[name] = value
    with pytest.raises(SettingsError) as error:
        load_settings(env)
    message = str(error.value)
    assert "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS=" in message and "MODELFORGE_NODE_STALE_AFTER_SECONDS=" in message
    for value in (stale, offline):
        assert (repr(value) if value is not None else "<missing>") in message


@pytest.mark.parametrize("value", ["abc", "1.5", "0", "-3", " "])
def test_settings_bad_integer_is_named(value: str) -> None:
    with pytest.raises(SettingsError) as error:
        load_settings({**BASE, "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": value or "x"})
    assert "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS" in str(error.value)


def test_settings_report_every_problem_at_once_without_values() -> None:
    with pytest.raises(SettingsError) as error:
        load_settings(
            {
                **BASE,
                "MODELFORGE_ADMIN_TOKEN": "short-secret",
                "MODELFORGE_NODES_TABLE": "bad name!",
                "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "x",
            }
        )
    problems = error.value.problems
    assert len(problems) == 3
    assert "short-secret" not in str(error.value)


def test_settings_missing_admin_token_is_refused() -> None:
    with pytest.raises(SettingsError, match="MODELFORGE_ADMIN_TOKEN"):
        load_settings({key: value for key, value in BASE.items() if key != "MODELFORGE_ADMIN_TOKEN"})


def test_settings_both_admin_token_forms_are_refused() -> None:
    with pytest.raises(SettingsError, match="only one"):
        load_settings({**BASE, "MODELFORGE_ADMIN_TOKEN_SHA256": "a" * 64})


@pytest.mark.parametrize("value", ["0", "1.5", "x", "-0.1"])
def test_settings_mass_stale_fraction_must_be_in_zero_to_one(value: str) -> None:
    with pytest.raises(SettingsError, match="MODELFORGE_SWEEP_MASS_STALE_FRACTION"):
        load_settings({**BASE, "MODELFORGE_SWEEP_MASS_STALE_FRACTION": value})


def test_settings_sweep_bucket_is_the_gap_between_interval_and_stale() -> None:
    settings = load_settings(BASE)
    assert settings.sweep_bucket_seconds == settings.stale_after_seconds - settings.heartbeat_interval_seconds == 45


@pytest.mark.parametrize(
    "weak",
    [
        pytest.param("a" * 40, id="one_repeated_character"),
        pytest.param("abcd" * 10, id="short_repeated_pattern"),
        pytest.param("0123456789" * 4, id="repeated_digits"),
        pytest.param("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", id="almost_one_character"),
        pytest.param("x" * 31, id="too_short"),
        pytest.param("Tr0ub4dor&3", id="short_password"),
        pytest.param(" " + secrets.token_urlsafe(32), id="leading_space"),
    ],
)
def test_settings_weak_admin_token_is_refused_by_name_never_by_value(weak: str) -> None:
    with pytest.raises(SettingsError) as error:
        load_settings({**BASE, "MODELFORGE_ADMIN_TOKEN": weak})
    assert "MODELFORGE_ADMIN_TOKEN" in str(error.value) and "modelforge admin-token new" in str(error.value)
    assert weak.strip() not in str(error.value)


@pytest.mark.parametrize(
    "strong",
    [
        pytest.param(secrets.token_urlsafe(32), id="urlsafe_32_bytes"),
        pytest.param(secrets.token_hex(32), id="hex_32_bytes"),
        pytest.param("correct horse battery staple glacier umbrella", id="passphrase"),
    ],
)
def test_admin_token_weakness_accepts_random_tokens(strong: str) -> None:
    assert admin_token_weakness(strong) is None


@pytest.mark.parametrize("resource", resources.ALL, ids=lambda resource: resource.name)
def test_settings_missing_resource_name_is_a_configuration_error_not_a_default(resource: resources.Resource) -> None:
    env = {key: value for key, value in BASE.items() if key != resource.env_var}
    with pytest.raises(SettingsError) as error:
        load_settings(env)
    assert resource.env_var in str(error.value)


def test_settings_names_every_catalogued_resource() -> None:
    settings = load_settings(BASE)
    assert settings.names == {resource.name: resource.local_name("unit") for resource in resources.ALL}
    assert settings.state_log_bucket == "unit-state-log"
