"""A node controls text the CLI prints (GPU names, CPU model, health detail, fail reasons): none of
its control characters reaches an admin's terminal (`nodes list`, `nodes show`, `work show`)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.admin_cli import modelforge
from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.work_items import claim_until

#: retitles the terminal, rings it, and turns what follows red
PAINT = "\x1b]0;pwned\x07\x1b[31m"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[31m"


def _painting_node(cp: ControlPlane) -> AgentIdentity:
    inventory = gpu_inventory(1)
    inventory["gpus"][0]["name"] = "H200 " + PAINT
    inventory["cpu"]["model"] = "EPYC " + PAINT
    inventory["capabilities"] = ["cpu", "diagnostic.echo"]
    identity = AgentIdentity()
    minted = cp.mint(display_name="paint box")
    enrolled = cp.enroll(minted["token"], identity, accelerator_mode="nvidia", inventory=inventory)
    assert enrolled.status_code == 201, enrolled.text
    beat = cp.heartbeat(identity, gpus=1, health={"status": "degraded", "detail": "hot " + PAINT})
    assert beat.status_code == 200, beat.text
    return identity


def _no_controls(text: str) -> None:
    assert not [char for char in text if char != "\n" and (ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0)], text


def test_node_text_is_printed_escaped_in_list_show_and_work_show(remote: ControlPlane, tmp_path: Path) -> None:
    node = _painting_node(remote)
    listed = modelforge(remote, "nodes", "list")
    assert listed.returncode == 0, listed.stderr
    _no_controls(listed.stdout)
    assert "paint box" in listed.stdout

    shown = modelforge(remote, "nodes", "show", str(node.node_id))
    assert shown.returncode == 0, shown.stderr
    _no_controls(shown.stdout)
    for text in ("H200 " + SHOWN, "EPYC " + SHOWN, "hot " + SHOWN):
        assert text in shown.stdout

    (tmp_path / "in.json").write_text(json.dumps({"fail": "me"}))
    submitted = modelforge(
        remote, "work", "submit", "diagnostic.echo", "--input", str(tmp_path / "in.json"), "--max-attempts", "1",
        "--json",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    work_id = submitted.json()["work_id"]
    claimed = claim_until(remote, node, work_id)
    failed = remote.lease_call(
        node, work_id, "fail", {"epoch": claimed["epoch"], "reason": "broke " + PAINT, "retryable": False}
    )
    assert failed.status_code == 200, failed.text
    work = modelforge(remote, "work", "show", work_id)
    assert work.returncode == 0, work.stderr
    _no_controls(work.stdout)
    assert "broke " + SHOWN in work.stdout
    # the JSON output escapes them as JSON does, and reads back as the node sent them
    assert modelforge(remote, "work", "show", work_id, "--json").json()["errors"][-1]["reason"] == "broke " + PAINT
