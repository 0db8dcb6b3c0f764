"""`modelforge admin-token new` prints a token the control plane accepts, and its digest."""

from __future__ import annotations

import hashlib

import pytest
from chalicelib.config import resources
from chalicelib.config.settings import load_settings
from modelforge_cli.cli import main


def test_admin_token_new_prints_a_strong_token_and_its_sha256(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admin-token", "new"]) == 0
    first = capsys.readouterr()
    token = first.out.strip()
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert f"AdminTokenSha256={digest}" in first.err and token not in first.err
    env = {
        **resources.local_names("unit"),
        "MODELFORGE_ADMIN_TOKEN": token,
        "MODELFORGE_NODE_STALE_AFTER_SECONDS": "60",
        "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
    }
    assert load_settings(env).admin_token_sha256 == digest
    assert main(["admin-token", "new"]) == 0
    assert capsys.readouterr().out.strip() != token
