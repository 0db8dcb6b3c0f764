"""The worker as the agent meets it: ``python -m modelforge_runtime_worker.main`` on a unix
socket, its artifact root populated from the rapidocr wheel on first start, real OCR on CPU.
One worker process serves the whole module."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from modelforge_protocol.versions import IMAGE_TAG_VERSION, WORKER_PROTOCOL_VERSION
from modelforge_runtime_worker.artifacts import BUNDLED, models_digest
from modelforge_runtime_worker.client import Answer

from tests.support.polling import wait_until
from tests.support.raw_http import read_until_closed, split_answers
from tests.worker.worker_support import (
    Worker,
    b64,
    run_worker_to_exit,
    squash,
    start_worker,
    text_png,
    worker_env,
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("worker")


@pytest.fixture(scope="module")
def worker(root: Path) -> Iterator[Worker]:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(root / "worker.sock"))  # left by a worker that was killed: nothing listens
    stale.close()
    with start_worker(root / "worker.log", worker_env(root)) as running:
        yield running


def refused(answer: Answer) -> tuple[int, str | None, bool]:
    assert set(answer.body) == {"error"}, answer.body
    return answer.status, answer.error_code, answer.body["error"]["retryable"]


def test_it_announces_where_it_listens_and_what_it_runs(worker: Worker, root: Path) -> None:
    assert worker.address == f"unix://{root / 'worker.sock'}"
    assert worker.capabilities == "ocr (cpu), diagnostic.echo, diagnostic.sleep"
    assert stat.S_IMODE(os.stat(root / "worker.sock").st_mode) == 0o660
    assert '"event": "stale_socket_removed"' in worker.output()


def test_status(worker: Worker) -> None:
    answer = worker.client().status()
    assert answer.status == 200
    assert answer.body == {
        "protocol_version": WORKER_PROTOCOL_VERSION,
        "worker_version": IMAGE_TAG_VERSION,
        "healthy": True,
        "busy": False,
        "slots": {"total": 1, "busy": 0, "gpus": []},
        "features": ["cancel", "slots", "gpu_slots"],
        "capabilities": [
            {
                "name": "ocr",
                "model": "rapidocr-3.10.0/PP-OCRv6-small",
                "model_sha256": models_digest(BUNDLED),
                "device": "cpu",
                "available": True,
                "reason": None,
            },
            {
                "name": "diagnostic.echo",
                "model": "builtin",
                "model_sha256": None,
                "device": "cpu",
                "available": True,
                "reason": None,
            },
            {
                "name": "diagnostic.sleep",
                "model": "builtin",
                "model_sha256": None,
                "device": "cpu",
                "available": True,
                "reason": None,
            },
        ],
    }


def test_first_start_populated_the_artifact_root(worker: Worker, root: Path) -> None:
    manifest = json.loads((root / "artifacts" / "manifest.json").read_text())
    assert [(entry["name"], entry["sha256"], entry["size"]) for entry in manifest["files"]] == [
        (model.name, model.sha256, model.size) for model in BUNDLED
    ]
    for model in BUNDLED:
        assert hashlib.sha256((root / "artifacts" / model.name).read_bytes()).hexdigest() == model.sha256
    assert list((root / "quarantine").iterdir()) == []


def test_echo_hashes_the_canonical_json_of_its_input(worker: Worker) -> None:
    payload = {"b": [1, 2.5, None, True], "a": {"z": "ü", "y": ""}}
    answer = worker.client().run("diagnostic.echo", payload)
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    assert answer.status == 200
    assert answer.body == {"result": {"sha256": hashlib.sha256(canonical).hexdigest(), "device": "cpu"}}


def test_ocr_reads_the_text_of_a_png(worker: Worker) -> None:
    answer = worker.client().run("ocr", {"image_base64": b64(text_png(["MODELFORGE 2026", "Runtime Worker"]))})
    assert answer.status == 200, answer.body
    result = answer.body["result"]
    assert set(result) == {"lines", "device", "model_sha256", "duration_ms", "detect_rotation", "score_note"}
    assert (result["device"], result["model_sha256"]) == ("cpu", models_digest(BUNDLED))
    assert result["detect_rotation"] is False and "likely misread" in result["score_note"]
    assert result["duration_ms"] > 0
    assert [squash(line["text"]) for line in result["lines"]] == ["MODELFORGE2026", "RUNTIMEWORKER"], result["lines"]
    for line in result["lines"]:
        assert 0.5 <= line["score"] <= 1
        assert len(line["box"]) == 4 and all(len(point) == 2 for point in line["box"])
    first_box_top = min(y for _, y in result["lines"][0]["box"])
    second_box_top = min(y for _, y in result["lines"][1]["box"])
    assert first_box_top < second_box_top  # boxes are in the input's pixels, in reading order


def test_ocr_reads_a_jpeg_too(worker: Worker) -> None:
    import io

    from PIL import Image

    jpeg = io.BytesIO()
    Image.open(io.BytesIO(text_png(["INVOICE 4711"]))).convert("RGB").save(jpeg, "JPEG", quality=90)
    answer = worker.client().run("ocr", {"image_base64": b64(jpeg.getvalue())})
    assert answer.status == 200, answer.body
    assert "INVOICE4711" in squash("".join(line["text"] for line in answer.body["result"]["lines"]))


def test_upside_down_lines_are_turned_only_when_detect_rotation_asks(worker: Worker) -> None:
    import io

    from PIL import Image

    upside_down = io.BytesIO()
    Image.open(io.BytesIO(text_png(["MODELFORGE 2026", "Runtime Worker"]))).rotate(180).save(upside_down, "PNG")
    expected = {"MODELFORGE2026", "RUNTIMEWORKER"}
    turned = worker.client().run("ocr", {"image_base64": b64(upside_down.getvalue()), "detect_rotation": True})
    assert turned.status == 200 and turned.body["result"]["detect_rotation"] is True
    assert {squash(line["text"]) for line in turned.body["result"]["lines"]} == expected
    as_is = worker.client().run("ocr", {"image_base64": b64(upside_down.getvalue())}).body["result"]
    assert {squash(line["text"]) for line in as_is["lines"]} != expected
    assert min(line["score"] for line in as_is["lines"]) < 0.8  # what the score note calls likely misread


def test_an_image_without_text_has_no_lines(worker: Worker) -> None:
    answer = worker.client().run("ocr", {"image_base64": b64(text_png([""], size=(200, 100)))})
    assert (answer.status, answer.body["result"]["lines"]) == (200, [])


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({}, "image_base64 is required"),
        ({"image_base64": 12}, "image_base64 is required"),
        ({"image_base64": "%%% not base64 %%%"}, "not valid base64"),
        ({"image_base64": b64(b"hello, I am a text file")}, "not a PNG or JPEG"),
        ({"image_base64": b64(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)}, "could not be decoded as PNG"),
        ({"image_base64": "", "language": "en"}, "unknown fields: language"),
        ({"image_base64": "", "detect_rotation": "true"}, "detect_rotation must be true or false"),
        ({"image_base64": "", "detect_rotation": 1}, "detect_rotation must be true or false"),
        ({"image_base64": "", "detect_rotation": None}, "detect_rotation must be true or false"),
    ],
)
def test_bad_ocr_input_is_422_not_retryable(worker: Worker, payload: dict, says: str) -> None:
    answer = worker.client().run("ocr", payload)
    assert refused(answer) == (422, "invalid_input", False)
    assert says in answer.body["error"]["message"]


def test_input_must_be_an_object(worker: Worker) -> None:
    assert refused(worker.client().run("ocr", "aGVsbG8=")) == (422, "invalid_input", False)


def test_an_unknown_capability_is_404(worker: Worker) -> None:
    answer = worker.client().run("translate", {})
    assert refused(answer) == (404, "unknown_capability", False)
    assert "diagnostic.echo, diagnostic.sleep, ocr" in answer.body["error"]["message"]


def test_an_oversized_body_is_413_before_it_is_read(worker: Worker, root: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(root / "worker.sock"))
        # the head and the start of a body one byte over the limit, in one write: the answer comes
        # without the rest (writing more could meet the closed connection)
        sock.sendall(
            b"POST /v1/run HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 8388609\r\n\r\n"
            + b'{"capability": "ocr", "input": {"image_base64": "'
            + b"A" * 1024
        )
        answers = split_answers(read_until_closed(sock))
    assert answers[0].status == 413
    assert answers[0].json()["error"]["code"] == "payload_too_large"
    # exactly the limit is accepted (and then judged on its content)
    body = b'{"capability":"diagnostic.echo","input":{"pad":"'
    body += b"x" * (8 * 1024 * 1024 - len(body) - 3) + b'"}}'
    answer = worker.client().request("POST", "/v1/run", body)
    assert answer.status == 200, answer.body


def test_a_second_run_while_ocr_runs_is_503_worker_busy(worker: Worker) -> None:
    """Real concurrency: a 12-line page keeps the worker busy for about a second while echo runs
    are sent back to back; those that arrive meanwhile are refused, retryable, and the page's own
    answer is unaffected. (Whichever of two runs arrives second is refused, so the page, like any
    client, retries on a retryable refusal: an echo may have been running when it arrived.)"""
    page = text_png([f"LINE {number:02d} OF A BUSY PAGE" for number in range(12)], font_size=32)
    answers: list[Answer] = []

    def read_page() -> None:
        for _ in range(100):
            answers.append(worker.client().run("ocr", {"image_base64": b64(page)}))
            if answers[-1].status != 503:
                return

    thread = threading.Thread(target=read_page, daemon=True)
    thread.start()
    busy: Answer | None = None
    while thread.is_alive() and busy is None:
        answer = worker.client().run("diagnostic.echo", {"probe": True})
        if answer.status == 503:
            busy = answer
        else:
            assert answer.status == 200, answer.body
    thread.join(60)
    assert busy is not None, "the OCR run ended before a concurrent run was refused"
    assert refused(busy) == (503, "worker_busy", True)
    assert all(refused(answer) == (503, "worker_busy", True) for answer in answers[:-1])
    assert answers[-1].status == 200
    assert len(answers[-1].body["result"]["lines"]) == 12
    assert worker.client().run("diagnostic.echo", {}).status == 200


def test_a_second_worker_on_the_same_socket_exits_3_and_leaves_the_first_alone(worker: Worker, root: Path) -> None:
    other = root / "other"
    env = worker_env(other, MODELFORGE_WORKER_LISTEN=f"unix://{root / 'worker.sock'}")
    done = run_worker_to_exit(env)
    assert done.returncode == 3, done.stderr
    assert "another process is listening on" in done.stderr and "MODELFORGE_WORKER_LISTEN" in done.stderr
    assert "Traceback" not in done.stderr
    assert worker.client().status().status == 200


def test_every_log_line_is_json(worker: Worker) -> None:
    assert worker.client().run("diagnostic.echo", {}).status == 200  # a job's access line (a status ask's is debug)
    wait_until(lambda: '"http_request"' in worker.output(), 10, "the job's access line")
    lines = [line for line in worker.output().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # rapidocr's own coloured lines would fail here
    events = {record.get("event") for record in records}
    assert {"artifacts_populated", "capability_loaded", "worker_listening", "http_request"} <= events
    assert all(record["level"] in ("debug", "info", "warning", "error") for record in records)
    assert not any("Traceback" in line for line in lines)


def test_answers_match_the_protocol_schemas_the_agent_checks(worker: Worker) -> None:
    work = pytest.importorskip("modelforge_protocol.work", reason="the worker answer schemas are not in this checkout")
    import jsonschema

    jsonschema.validate(worker.client().status().body, work.WORKER_STATUS)
    answers = [
        worker.client().run("diagnostic.echo", {"a": 1}),
        worker.client().run("diagnostic.sleep", {"seconds": 0}, "work_d:1"),
        worker.client().run("ocr", {"image_base64": b64(text_png(["OK"]))}),
        worker.client().run("ocr", {}),
        worker.client().run("nope", {}),
        worker.client().request("POST", "/v1/run", b"{bad json"),
    ]
    assert [answer.status for answer in answers] == [200, 200, 200, 422, 404, 400]
    for answer in answers:
        jsonschema.validate(answer.body, work.WORKER_RUN_ANSWER)
    jsonschema.validate(worker.client().cancel("work_d:1").body, work.WORKER_CANCEL_ANSWER)


def test_a_cancelled_sleep_stops_at_once_and_the_worker_takes_jobs_again(worker: Worker) -> None:
    answers: list[Answer] = []
    thread = threading.Thread(
        target=lambda: answers.append(worker.client().run("diagnostic.sleep", {"seconds": 60}, "work_a:1")),
        daemon=True,
    )
    thread.start()
    wait_until(lambda: worker.client().status().body["busy"], 10, "the sleep to start")
    began = time.monotonic()
    cancelled = worker.client().cancel("work_a:1")
    assert (cancelled.status, cancelled.body) == (200, {"job_id": "work_a:1", "state": "ended"})
    thread.join(5)
    took = time.monotonic() - began
    assert refused(answers[0]) == (409, "job_cancelled", True)
    assert worker.client().status().body["busy"] is False
    assert worker.client().run("diagnostic.echo", {}).status == 200
    assert took < 1.0, took  # the worker is free as soon as the cancel is answered


def test_a_short_sleep_runs_to_its_end(worker: Worker) -> None:
    answer = worker.client().run("diagnostic.sleep", {"seconds": 0.1}, "work_b:1")
    assert answer.status == 200 and answer.body["result"]["device"] == "cpu"
    assert 0.1 <= answer.body["result"]["slept_seconds"] < 5


def test_a_cancelled_ocr_run_is_aborted_inside_onnxruntime(worker: Worker) -> None:
    page = text_png([f"LINE {number:03d} OF A VERY LONG PAGE 2026" for number in range(100)], font_size=20)
    answers: list[Answer] = []
    thread = threading.Thread(
        target=lambda: answers.append(worker.client().run("ocr", {"image_base64": b64(page)}, "work_c:1")),
        daemon=True,
    )
    thread.start()
    wait_until(lambda: worker.client().status().body["busy"], 30, "the OCR run to start")
    began = time.monotonic()
    state = worker.client(timeout=10).cancel("work_c:1").body["state"]
    thread.join(10)
    assert state in ("ended", "ending") and answers, state
    assert refused(answers[0]) == (409, "job_cancelled", True)
    assert time.monotonic() - began < 4  # the page alone takes about 7 s
    assert worker.client().run("diagnostic.echo", {}).status == 200


def test_an_old_agent_reads_the_new_status_and_runs_as_before(worker: Worker) -> None:
    """An agent of 1.3.0 knows neither ``features`` nor ``busy`` nor ``job_id``: its status schema
    (the same object schema without the new properties) still accepts the answer, and its run
    request is served as it always was."""
    import copy

    import jsonschema
    from modelforge_protocol import work

    old_status = copy.deepcopy(work.WORKER_STATUS)
    for added in ("features", "busy"):
        del old_status["properties"][added]
    jsonschema.validate(worker.client().status().body, old_status)
    answer = worker.client().request("POST", "/v1/run", b'{"capability": "diagnostic.sleep", "input": {"seconds": 0}}')
    assert answer.status == 200
    jsonschema.validate(answer.body, work.WORKER_RUN_ANSWER)
