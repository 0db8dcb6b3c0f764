"""The OCR engine's guards: rapidocr can never download, CUDA is used only when onnxruntime really
offers it, an abort reaches every onnxruntime run of a job, and the sessions run the very bytes
whose SHA-256 was checked (a model swapped after the check and back cannot run)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from modelforge_runtime_worker.artifacts import BUNDLED, QUARANTINED, Artifacts, bundled_models_dir
from modelforge_runtime_worker.capabilities import Ocr, refuse_unavailable
from modelforge_runtime_worker.ocr import (
    CUDA_PROVIDER,
    Cancel,
    DownloadRefused,
    ModelLoadFailed,
    OcrEngine,
    refuse_downloads,
)
from modelforge_runtime_worker.server import http_error


def test_rapidocr_cannot_download_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    from rapidocr.utils import download_file

    monkeypatch.setattr(download_file.DownloadFile, "run", download_file.DownloadFile.run)  # restored after
    refuse_downloads()
    request = download_file.DownloadFileInput(
        file_url="https://example.invalid/model.onnx",
        save_path=Path("/nonexistent/model.onnx"),
        logger=logging.getLogger("t"),
    )
    with pytest.raises(DownloadRefused, match="never downloads"):
        download_file.DownloadFile.run(request)


def cuda_offered() -> bool:
    import onnxruntime

    return CUDA_PROVIDER in onnxruntime.get_available_providers()


@pytest.mark.skipif(cuda_offered(), reason="onnxruntime here offers CUDA")
def test_cuda_asked_for_but_not_offered_makes_ocr_unavailable(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadFailed) as failed:
        OcrEngine({"det": b"d", "cls": b"c", "rec": b"r"}, "cuda")
    assert failed.value.reason == "cuda_unavailable"

    artifacts = Artifacts(tmp_path / "artifacts", tmp_path / "quarantine", bundle_dir=bundled_models_dir())
    state = artifacts.prepare()  # the real models, copied from the wheel
    ocr = Ocr(state, artifacts, "cuda")
    assert (ocr.available, ocr.reason, ocr.device) == (False, "cuda_unavailable", "cuda")
    refusal = http_error(refuse_unavailable(ocr))
    assert (refusal.status, refusal.code, refusal.retryable) == (409, "capability_unavailable", False)


class Options:
    terminate = None


def test_an_abort_reaches_runs_started_before_and_after_it() -> None:
    cancel = Cancel()
    before = cancel.run_options(Options)
    assert before.terminate is False
    cancel.set()
    assert before.terminate is True and cancel.is_set()
    assert cancel.run_options(Options).terminate is True


class SessionSpy:
    """Wraps ``onnxruntime.InferenceSession``: records what each session is made from, and runs
    ``on_call`` (the attacker's move) before each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, on_call: Any = None) -> None:
        import onnxruntime
        import rapidocr.inference_engine.onnxruntime.main  # noqa: F401 - imported with the real class

        self.real = onnxruntime.InferenceSession
        self.made_from: list[Any] = []
        self.on_call = on_call
        monkeypatch.setattr(onnxruntime, "InferenceSession", self)

    def __call__(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        if self.on_call is not None:
            self.on_call(len(self.made_from))
        self.made_from.append(model)
        return self.real(model, *args, **kwargs)


def swap(path: Path, data: bytes) -> None:
    """Replace ``path``'s content in place (as an attacker with write access to the root would)."""
    os.chmod(path, 0o644)
    path.write_bytes(data)


def test_the_sessions_run_the_checked_bytes_even_if_the_file_is_swapped_during_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifacts = Artifacts(tmp_path / "artifacts", tmp_path / "quarantine", bundle_dir=bundled_models_dir())
    state = artifacts.prepare()  # the real models, copied from the wheel and checked
    det = tmp_path / "artifacts" / BUNDLED[0].name
    original = det.read_bytes()

    def attacker(call: int) -> None:  # swapped while the sessions are made, back before the load ends
        if call == 0:
            swap(det, b"a forged detector" + original[17:])
        if call == 2:
            swap(det, original)

    spy = SessionSpy(monkeypatch, attacker)
    ocr = Ocr(state, artifacts, "cpu")
    assert ocr.available, ocr.reason
    pinned = {model.sha256 for model in BUNDLED}
    assert [type(model) for model in spy.made_from] == [bytes, bytes, bytes]  # never a path to open again
    assert {hashlib.sha256(model).hexdigest() for model in spy.made_from} == pinned


def test_a_model_swapped_after_the_start_check_is_quarantined_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifacts = Artifacts(tmp_path / "artifacts", tmp_path / "quarantine", bundle_dir=bundled_models_dir())
    state = artifacts.prepare()
    rec = tmp_path / "artifacts" / BUNDLED[2].name
    swap(rec, b"a forged recogniser")
    spy = SessionSpy(monkeypatch)
    ocr = Ocr(state, artifacts, "cpu")
    assert (ocr.available, ocr.reason) == (False, QUARANTINED)
    assert spy.made_from == []  # nothing was loaded, not even the two good models
    assert (tmp_path / "quarantine" / BUNDLED[2].name).read_bytes() == b"a forged recogniser"
