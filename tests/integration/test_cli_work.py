"""`modelforge work submit|list|show|cancel|result` as a subprocess against `modelforge local up`."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from tests.support.admin_cli import modelforge
from tests.support.api import AgentIdentity, ControlPlane
from tests.support.work_items import claim_until, finish

ECHO = "diagnostic.echo"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
UNKNOWN = "work_" + "0" * 32


def _submitted(cp: ControlPlane, path: Path, document: dict[str, Any], *extra: str) -> dict[str, Any]:
    path.write_text(json.dumps(document))
    done = modelforge(cp, "work", "submit", ECHO, "--input", str(path), "--json", *extra)
    assert done.returncode == 0, done.stderr
    return done.json()  # type: ignore[no-any-return]


def _node(cp: ControlPlane, capabilities: tuple[str, ...] = ("cpu", ECHO)) -> AgentIdentity:
    node = cp.worker_node(capabilities)
    assert cp.heartbeat(node).status_code == 200
    return node


def test_submit_an_input_file_with_options_and_an_idempotent_retry(remote: ControlPlane, tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_text('{"hello": "cli"}')
    key = f"cli-retry-{path.stat().st_ino}"
    args = (
        "work",
        "submit",
        ECHO,
        "--input",
        str(path),
        "--max-attempts",
        "5",
        "--lease-seconds",
        "30",
        "--idempotency-key",
        key,
    )
    done = modelforge(remote, *args)
    assert done.returncode == 0, done.stderr
    work_id = re.search(r"^work (work_\w+) submitted \(diagnostic\.echo\): queued$", done.stdout, re.M).group(1)  # type: ignore[union-attr]
    assert f"modelforge work result {work_id}" in done.stdout
    item = remote.work(work_id)
    assert (item["max_attempts"], item["lease_seconds"], item["status"]) == (5, 30, "queued")
    assert item["input"]["size"] == len(json.dumps({"hello": "cli"}, separators=(",", ":")))
    retried = modelforge(remote, *args)
    assert retried.returncode == 0 and f"work {work_id} was already submitted" in retried.stdout
    as_json = modelforge(remote, *args, "--json").json()
    assert as_json["work_id"] == work_id


def test_submit_an_image_sends_it_base64_encoded(remote: ControlPlane, tmp_path: Path) -> None:
    (tmp_path / "page.png").write_bytes(PNG)
    item = modelforge(remote, "work", "submit", "ocr", "--image", str(tmp_path / "page.png"), "--json").json()
    assert item["capability"] == "ocr" and item["status"] == "queued"
    node = _node(remote, ("cpu", "ocr"))
    claimed = claim_until(remote, node, item["work_id"])
    document = requests.get(claimed["input_url"], timeout=30).json()
    assert base64.b64decode(document["image_base64"]) == PNG
    assert "detect_rotation" not in document  # the capability's default (off) decides
    done = finish(remote, node, claimed, b'{"lines": []}')
    assert done.status_code == 200, done.text
    rotated = modelforge(
        remote, "work", "submit", "ocr", "--image", str(tmp_path / "page.png"), "--detect-rotation", "--json"
    ).json()
    claimed = claim_until(remote, node, rotated["work_id"])
    document = requests.get(claimed["input_url"], timeout=30).json()
    assert document["detect_rotation"] is True and base64.b64decode(document["image_base64"]) == PNG
    assert finish(remote, node, claimed, b'{"lines": []}').status_code == 200


def test_submit_refuses_bad_input_in_one_line_with_exit_2(remote: ControlPlane, tmp_path: Path) -> None:
    (tmp_path / "text.txt").write_text("not an image")
    (tmp_path / "broken.json").write_text('{"a": 1,\n "b": }')
    (tmp_path / "array.json").write_text("[1, 2]")
    (tmp_path / "big.json").write_text(json.dumps({"blob": "x" * (5 * 1024 * 1024)}))
    cases = {
        ("ocr", "--image", str(tmp_path / "text.txt")): "is not a PNG or JPEG image",
        (ECHO, "--input", str(tmp_path / "broken.json")): "is not JSON: Expecting value at line 2 column 7",
        (ECHO, "--input", str(tmp_path / "array.json")): "must hold one JSON object ({...}), not an array",
        (ECHO, "--input", str(tmp_path / "missing.json")): "cannot read",
        (ECHO, "--input", str(tmp_path / "big.json")): "the API takes at most 5.0 MiB",
        ("ocr", "--input", str(tmp_path / "array.json"), "--detect-rotation"): "--detect-rotation goes with --image",
    }
    for args, message in cases.items():
        done = modelforge(remote, "work", "submit", *args)
        assert done.returncode == 2 and done.stdout == "", (args, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    refused = modelforge(remote, "work", "submit", ECHO, "--input", "-", "--max-attempts", "11", stdin=b'{"n": 1}')
    assert (
        refused.returncode == 2
        and refused.stderr.startswith("modelforge: invalid_request: ")
        and "max_attempts" in refused.stderr
    )
    for usage in (
        ("work", "submit", ECHO),
        ("work", "submit", ECHO, "--input", "a", "--image", "b"),
        ("work", "submit", "gpu.magic", "--input", "a"),
    ):
        done = modelforge(remote, *usage)
        assert done.returncode == 2 and "usage: modelforge work submit" in done.stderr


def test_list_show_and_filters(remote: ControlPlane, tmp_path: Path) -> None:
    item = _submitted(remote, tmp_path / "in.json", {"list": "me"})
    listing = modelforge(remote, "work", "list", "--status", "queued", "--capability", ECHO)
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert re.split(r"\s{2,}", header.strip()) == ["ID", "CAPABILITY", "STATUS", "ATTEMPTS", "NODE", "AGE"]
    row = re.split(r"\s{2,}", next(line for line in rows if item["work_id"] in line).strip())
    assert row[:5] == [item["work_id"], ECHO, "queued", "0/3", "-"] and re.fullmatch(r"\d+s", row[5])
    assert all(" queued " in line and ECHO in line for line in rows)
    assert item["work_id"] not in modelforge(remote, "work", "list", "--status", "succeeded").stdout
    as_json = modelforge(remote, "work", "list", "--json").json()
    assert as_json["next_token"] is None and item["work_id"] in {work["work_id"] for work in as_json["work"]}

    show = modelforge(remote, "work", "show", item["work_id"])
    assert re.search(r"^status:\s+queued$", show.stdout, re.M) and re.search(r"^attempts:\s+0 of 3$", show.stdout, re.M)
    shown = modelforge(remote, "work", "show", item["work_id"], "--json").json()
    assert shown == remote.work(item["work_id"])
    unknown = modelforge(remote, "work", "show", UNKNOWN)
    assert (unknown.returncode, unknown.stderr.strip()) == (1, "modelforge: work_not_found: no such work")


def test_cancel_a_queued_item_then_refusals(remote: ControlPlane, tmp_path: Path) -> None:
    item = _submitted(remote, tmp_path / "in.json", {"cancel": "me"})
    done = modelforge(remote, "work", "cancel", item["work_id"])
    assert done.returncode == 0 and "cancelled" in done.stdout, done.stderr
    assert remote.work(item["work_id"])["status"] == "cancelled"
    again = modelforge(remote, "work", "cancel", item["work_id"], "--json")
    assert again.returncode == 2 and again.stderr.startswith("modelforge: work_finished: ")
    assert modelforge(remote, "work", "cancel", UNKNOWN).returncode == 1
    result = modelforge(remote, "work", "result", item["work_id"])
    assert result.returncode == 1 and "is cancelled" in result.stderr


def test_result_waits_for_success_then_downloads_and_verifies(remote: ControlPlane, tmp_path: Path) -> None:
    item = _submitted(remote, tmp_path / "in.json", {"result": "please"})
    early = modelforge(remote, "work", "result", item["work_id"])
    assert early.returncode == 1 and early.stdout == ""
    assert f"work {item['work_id']} is queued (attempt 0 of 3): no result yet" in early.stderr
    node = _node(remote)
    claimed = claim_until(remote, node, item["work_id"])
    body = b'{"echo": "please", "n": 1}'
    done = finish(remote, node, claimed, body)
    assert done.status_code == 200, done.text

    to_stdout = subprocess_bytes(remote, "work", "result", item["work_id"])
    assert to_stdout == body
    target = tmp_path / "out" / "result.json"
    target.parent.mkdir()
    done = modelforge(remote, "work", "result", item["work_id"], "-o", str(target))
    assert done.returncode == 0 and done.stdout == "" and "verified" in done.stderr
    assert target.read_bytes() == body

    # the upload URL is still valid, but complete sealed a copy that no upload URL reaches: a new
    # upload changes nothing the CLI downloads
    assert requests.put(claimed["result_upload_url"], data=body.upper(), timeout=30).status_code == 200
    assert subprocess_bytes(remote, "work", "result", item["work_id"]) == body

    # the sealed copy itself changes behind the API's back (the local emulator takes any local
    # process's made-up credentials, docs/SECURITY.md): the download is refused, nothing is written
    sealed = _sealed_object(remote.work(item["work_id"])["result"]["url"])
    sealed(body.upper())
    tampered = modelforge(remote, "work", "result", item["work_id"], "-o", str(tmp_path / "out" / "tampered.json"))
    assert tampered.returncode == 2 and "does not match the SHA-256" in tampered.stderr
    assert sorted(path.name for path in target.parent.iterdir()) == ["result.json"]
    assert "X-Amz-" not in tampered.stderr and "Signature" not in tampered.stderr  # the URL is a secret
    sealed(body + b" ")
    longer = modelforge(remote, "work", "result", item["work_id"])
    assert longer.returncode == 2 and "larger than" in longer.stderr and longer.stdout == ""


def test_result_of_dead_work_names_the_last_reason(remote: ControlPlane, tmp_path: Path) -> None:
    item = _submitted(remote, tmp_path / "in.json", {"fail": "me"}, "--max-attempts", "1")
    node = _node(remote)
    claimed = claim_until(remote, node, item["work_id"])
    failed = remote.lease_call(
        node, item["work_id"], "fail", {"epoch": claimed["epoch"], "reason": "cli test failure", "retryable": False}
    )
    assert failed.status_code == 200, failed.text
    done = modelforge(remote, "work", "result", item["work_id"])
    assert done.returncode == 1 and "is dead after 1 attempt, no result" in done.stderr, done.stderr
    assert "cli test failure" in done.stderr
    show = modelforge(remote, "work", "show", item["work_id"])
    assert re.search(r"^ATTEMPT\s+EPOCH\s+NODE\s+RETRYABLE\s+AT\s+REASON$", show.stdout, re.M)
    assert "cli test failure" in show.stdout


def _sealed_object(url: str) -> Callable[[bytes], None]:
    """Replaces the object a result URL serves, straight in the local emulator (not through the API)."""
    import boto3

    where = urlsplit(url)
    bucket, key = where.path.lstrip("/").split("/", 1)
    s3 = boto3.client(
        "s3",
        endpoint_url=f"{where.scheme}://{where.netloc}",
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )

    def replace(data: bytes) -> None:
        s3.put_object(Bucket=bucket, Key=key, Body=data)

    return replace


def subprocess_bytes(cp: ControlPlane, *args: str) -> bytes:
    """The raw stdout of a command that writes bytes."""
    import subprocess

    from tests.support.admin_cli import environment
    from tests.support.processes import cli_command

    done = subprocess.run(cli_command(*args), env=environment(cp), input=b"", capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout
