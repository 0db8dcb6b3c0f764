"""`enrollments create` prints the address nodes use: on a deployed stack the nodes' HTTP API
(`--node-url` or MODELFORGE_NODE_URL), not the admin REST API's URL with its stage path, which
the agent refuses (MODELFORGE_AGENT_CONTROL_PLANE_URL is scheme://host[:port] only)."""

from __future__ import annotations

import argparse

import pytest
from modelforge_cli.admin_api import AdminApi, CommandFailed
from modelforge_cli.enrollments_cli import NODE_URL_VAR, next_steps, node_hostname, node_url

ADMIN_URL = "https://r3st4p1id.execute-api.eu-west-1.amazonaws.com/api"
NODE_URL = "https://h77p4p1id.execute-api.eu-west-1.amazonaws.com"
MINTED = {"enrollment_id": "enr_1", "display_name": "GPU Node", "expires_at": "2030-01-01T00:00:00Z", "token": "tok"}


def test_the_node_url_option_wins_then_the_variable_then_the_api_url(monkeypatch: pytest.MonkeyPatch) -> None:
    api = AdminApi(ADMIN_URL, "t" * 43)
    monkeypatch.delenv(NODE_URL_VAR, raising=False)
    assert (
        node_url(argparse.Namespace(node_url=None), AdminApi("http://127.0.0.1:8000", "t")) == "http://127.0.0.1:8000"
    )
    monkeypatch.setenv(NODE_URL_VAR, NODE_URL + "/")
    assert node_url(argparse.Namespace(node_url=None), api) == NODE_URL
    assert node_url(argparse.Namespace(node_url="https://nodes.example.com"), api) == "https://nodes.example.com"


def test_a_node_url_with_a_path_is_refused_before_anything_is_minted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NODE_URL_VAR, raising=False)
    with pytest.raises(CommandFailed, match="no path"):
        node_url(argparse.Namespace(node_url=None), AdminApi(ADMIN_URL, "t" * 43))


def test_the_printed_agent_configuration_names_the_node_url() -> None:
    text = next_steps(MINTED, AdminApi(ADMIN_URL, "t" * 43), NODE_URL)
    assert f"MODELFORGE_AGENT_CONTROL_PLANE_URL={NODE_URL}\n" in text
    assert ADMIN_URL not in text


@pytest.mark.parametrize(
    "url",
    [
        "https://nodes$(id).example.com",
        'https://"nodes".example.com',
        "https://no des.example.com",
        "http://nodes.example.com",
    ],
)
def test_a_node_url_that_is_not_exactly_an_origin_is_refused(url: str) -> None:
    with pytest.raises(CommandFailed, match="no path"):
        node_url(argparse.Namespace(node_url=url), AdminApi(ADMIN_URL, "t" * 43))


def test_the_printed_env_names_the_hostname_made_from_the_display_name_or_given() -> None:
    """Issue 21: a containerised agent would otherwise report its container id."""
    assert "\nMODELFORGE_AGENT_HOSTNAME=gpu_node\n" in next_steps(MINTED, AdminApi(ADMIN_URL, "t" * 43), NODE_URL)
    given = next_steps(MINTED, AdminApi(ADMIN_URL, "t" * 43), NODE_URL, "rack-4.example")
    assert given.count("\nMODELFORGE_AGENT_HOSTNAME=rack-4.example\n") == 2  # with containers and without
    assert node_hostname(argparse.Namespace(hostname=None, name="Rack 4 / GPU box")) == "rack_4_gpu_box"
    with pytest.raises(CommandFailed, match="--hostname"):
        node_hostname(argparse.Namespace(hostname="-bad host", name="x"))
