from __future__ import annotations

import hashlib

import pytest
from chalicelib.settings import SettingsError, load_settings

TOKEN = "t" * 40
BASE = {
    "MODELFORGE_ADMIN_TOKEN": TOKEN,
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": "60",
    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
}


def test_settings_defaults_are_valid_with_an_admin_token() -> None:
    settings = load_settings(BASE)
    assert settings.heartbeat_interval_seconds == 15
    assert settings.stale_after_seconds < settings.offline_after_seconds
    assert settings.admin_token_sha256 == hashlib.sha256(TOKEN.encode()).hexdigest()


def test_settings_accept_only_the_admin_token_digest() -> None:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert load_settings({**BASE, "MODELFORGE_ADMIN_TOKEN": "", "MODELFORGE_ADMIN_TOKEN_SHA256": digest}).admin_token_sha256 == digest


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
    for name, value in (("MODELFORGE_NODE_STALE_AFTER_SECONDS", stale), ("MODELFORGE_NODE_OFFLINE_AFTER_SECONDS", offline)):
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
