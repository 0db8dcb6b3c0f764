"""The OCR engine's guards, without loading models: rapidocr can never download, CUDA is used
only when onnxruntime really offers it, and an abort reaches every onnxruntime run of a job."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from modelforge_runtime_worker.artifacts import Artifacts, bundled_models_dir
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
        OcrEngine({"det": tmp_path / "d", "cls": tmp_path / "c", "rec": tmp_path / "r"}, "cuda")
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
