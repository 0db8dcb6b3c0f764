"""A model file that no longer matches the manifest is quarantined at the next start: moved out
with a note, never loaded, and the OCR capability refuses runs (not retryable) while the worker
still serves everything else."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from modelforge_runtime_worker.artifacts import BUNDLED, models_digest

from tests.worker.worker_support import Worker, b64, start_worker, text_png, worker_env

REC = next(model for model in BUNDLED if model.role == "rec")


@pytest.fixture(scope="module")
def tampered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Worker, Path, bytes]]:
    """A worker populated and stopped once, then started again after one byte of the rec model changed."""
    root = tmp_path_factory.mktemp("quarantine")
    with start_worker(root / "first.log", worker_env(root)) as first:
        assert first.capabilities == "ocr (cpu), diagnostic.echo, diagnostic.sleep"
    rec = root / "artifacts" / REC.name
    os.chmod(rec, 0o644)
    with open(rec, "r+b") as handle:  # same size, one byte flipped in the middle
        handle.seek(REC.size // 2)
        byte = handle.read(1)
        handle.seek(REC.size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    tampered_bytes = rec.read_bytes()
    with start_worker(root / "second.log", worker_env(root)) as second:
        yield second, root, tampered_bytes


def test_the_file_is_moved_to_quarantine_with_a_note(tampered: tuple[Worker, Path, bytes]) -> None:
    worker, root, data = tampered
    assert not (root / "artifacts" / REC.name).exists()
    assert (root / "quarantine" / REC.name).read_bytes() == data
    note = json.loads((root / "quarantine" / f"{REC.name}.quarantine.json").read_text())
    assert note["reason"] == "sha256_mismatch"
    assert note["expected_sha256"] == REC.sha256
    assert note["found_sha256"] not in (None, REC.sha256) and len(note["found_sha256"]) == 64
    assert note["quarantined_at"].endswith("+00:00")
    assert '"event": "artifact_quarantined"' in worker.output()


def test_ocr_is_unavailable_and_never_loaded(tampered: tuple[Worker, Path, bytes]) -> None:
    worker, _, _ = tampered
    assert worker.capabilities == "ocr (unavailable: artifact_quarantined), diagnostic.echo, diagnostic.sleep"
    status = worker.client().status().body
    assert status["healthy"] is False
    assert status["capabilities"][0] == {
        "name": "ocr",
        "model": "rapidocr-3.10.0/PP-OCRv6-small",
        "model_sha256": models_digest(BUNDLED),
        "device": "cpu",
        "available": False,
        "reason": "artifact_quarantined",
    }
    assert '"event": "capability_loaded"' not in worker.output()


def test_a_run_is_refused_not_retryable(tampered: tuple[Worker, Path, bytes]) -> None:
    worker, _, _ = tampered
    answer = worker.client().run("ocr", {"image_base64": b64(text_png(["NEVER READ"]))})
    assert answer.status == 409
    assert answer.body["error"]["code"] == "artifact_quarantined"
    assert answer.body["error"]["retryable"] is False
    assert "quarantined" in answer.body["error"]["message"]


def test_the_rest_still_works(tampered: tuple[Worker, Path, bytes]) -> None:
    worker, _, _ = tampered
    assert worker.client().run("diagnostic.echo", {"still": "here"}).status == 200


def test_the_next_start_stays_quarantined_until_an_operator_acts(tampered: tuple[Worker, Path, bytes]) -> None:
    _, root, _ = tampered
    env = worker_env(
        root, MODELFORGE_WORKER_LISTEN=f"unix://{root / 'third.sock'}", MODELFORGE_WORKER_LOG_LEVEL="ERROR"
    )
    with start_worker(root / "third.log", env) as third:  # the listening line shows at any level
        assert third.capabilities == "ocr (unavailable: artifact_quarantined), diagnostic.echo, diagnostic.sleep"
    assert not (root / "artifacts" / REC.name).exists()  # never refilled behind the operator's back
    # the first note (what was found) is kept; a missing file adds no second one
    assert sorted(path.name for path in (root / "quarantine").iterdir()) == [REC.name, f"{REC.name}.quarantine.json"]
