"""A presigned PUT stores its bytes as sent, whatever its Content-Type, as S3 does.

``curl --data-binary @file URL`` sends ``Content-Type: application/x-www-form-urlencoded``. The local
emulator used to parse such a body as a form (storing nothing, or a field's name) and, for bytes
that are not UTF-8, to lose the body and wait for it; the result then failed the work's checksum
locally, and would pass on S3. Over HTTP against the local stack: submit, claim, upload, complete,
fetch.
"""

from __future__ import annotations

import hashlib
import time

import pytest
import requests

from tests.support.api import ControlPlane
from tests.support.work_items import claim_until

ECHO = "diagnostic.echo"
#: what curl --data-binary sends unless told otherwise
CURL_DATA_BINARY = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param('{"text":"a=b&c=d+e%20f","ok":"été"}'.encode(), id="json_that_parses_as_a_form"),
        pytest.param(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, id="bytes_that_are_not_utf8"),
        pytest.param(b"key=k&file=f", id="a_form_upload_lookalike"),
    ],
)
@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(CURL_DATA_BINARY, id="curl_data_binary"),
        pytest.param({"Content-Type": "multipart/form-data; boundary=x"}, id="multipart"),
    ],
)
def test_a_result_uploaded_with_a_form_content_type_is_stored_as_sent_and_completes(
    stack, cp: ControlPlane, body: bytes, headers: dict[str, str]
) -> None:  # type: ignore[no-untyped-def]
    submitted = cp.submit_work(ECHO, {"n": time.time()})
    assert submitted.status_code == 201, submitted.text
    node = cp.worker_node(("cpu", ECHO))
    assert cp.heartbeat(node).status_code == 200
    claimed = claim_until(cp, node, submitted.json()["work_id"])

    upload = requests.put(claimed["result_upload_url"], data=body, headers=headers, timeout=30)
    assert upload.status_code == 200, upload.text
    digest = hashlib.sha256(body).hexdigest()
    done = cp.lease_call(
        node, claimed["work_id"], "complete", {"epoch": claimed["epoch"], "sha256": digest, "size": len(body)}
    )
    assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text
    result = cp.work(claimed["work_id"])["result"]
    fetched = requests.get(result["url"], timeout=30, allow_redirects=False)
    assert fetched.status_code == 200 and fetched.content == body
    assert result["sha256"] == digest
