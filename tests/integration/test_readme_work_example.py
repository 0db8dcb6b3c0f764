"""The README's "Your first piece of work" commands, run as written against `modelforge local up`
with a page far over the ~96 KB at which an image in a command-line argument fails with
`Argument list too long` (issue 21, "The first hour" 1)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path

import requests

from tests.conftest import ADMIN_TOKEN, repo_root
from tests.support.api import ControlPlane
from tests.support.work_items import claim_until, finish

DOCUMENTED_API = "http://127.0.0.1:8000"
#: A PNG as the API checks it (the magic bytes), 256 KB: its base64 is far over one argument's limit.
PAGE = b"\x89PNG\r\n\x1a\n" + os.urandom(256 * 1024)
RESULT = b'{"lines": [{"text": "hello", "score": 0.99, "box": [[0, 0], [1, 0], [1, 1], [0, 1]]}]}'


def readme_work_commands() -> list[str]:
    """The commands of the README's first bash block under "Your first piece of work", each with
    its continuation lines joined."""
    readme = (repo_root() / "README.md").read_text()
    section = readme[readme.index("## Your first piece of work") :]
    block = section[section.index("```bash\n") + len("```bash\n") : section.index("\n```", section.index("```bash"))]
    return [command for command in block.replace("\\\n", " ").splitlines() if command.strip()]


def _run(command: str, cp: ControlPlane, folder: Path, **env: str) -> str:
    script = command.replace(DOCUMENTED_API, cp.base_url)
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", script],
        cwd=folder,
        env={"PATH": os.environ["PATH"], "KEY": ADMIN_TOKEN, **env},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"Argument list too long" not in done.stderr
    return done.stdout.decode()


def test_the_readme_submits_a_large_page_and_reads_its_result_back(remote: ControlPlane, tmp_path: Path) -> None:
    submit, show, result = readme_work_commands()
    assert submit.startswith("WORK=$(") and "page.png" in submit and DOCUMENTED_API in submit
    (tmp_path / "page.png").write_bytes(PAGE)

    work_id = _run(submit + '\nprintf %s "$WORK"', remote, tmp_path)
    assert re.fullmatch(r"work_[0-9a-f]{32}", work_id), work_id
    assert remote.work(work_id)["capability"] == "ocr"

    node = remote.worker_node(("cpu", "ocr"))
    assert remote.heartbeat(node).status_code == 200
    claimed = claim_until(remote, node, work_id)
    document = requests.get(claimed["input_url"], timeout=30).json()
    assert base64.b64decode(document["image_base64"]) == PAGE
    assert finish(remote, node, claimed, RESULT).status_code == 200

    item = json.loads(_run(show, remote, tmp_path, WORK=work_id))
    assert (item["work_id"], item["status"], item["attempts"]) == (work_id, "succeeded", 1)
    assert _run(result, remote, tmp_path, WORK=work_id).encode() == RESULT
