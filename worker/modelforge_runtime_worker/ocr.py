"""The OCR engine: RapidOCR's det/cls/rec pipeline on onnxruntime, loaded only from the verified
bytes of the artifact root's models, on the device it actually got, and abortable mid-run.

- **What was checked is what runs.** Each model is handed over as the bytes whose SHA-256 was
  checked (``Artifacts.read_models``): the worker makes each ``onnxruntime.InferenceSession`` from
  them, with rapidocr's own session options and providers, and gives it to rapidocr (its
  ``<stage>.session`` setting), so no file is opened again after the check.
- **No downloads.** No model path is given at all, the rec model carries its character set in its
  ONNX metadata (so no dictionary is fetched), and rapidocr's downloader is replaced by one that
  refuses (``refuse_downloads``) before rapidocr is used, so nothing this process does can fetch a
  model: an attempt fails the load instead. Images are handed over decoded (never as a path or
  URL, which rapidocr would open or fetch itself).
- **Orientation.** The text-line orientation classifier (the cls stage) runs only for a job that
  asks for it (``detect_rotation``): on upright pages it turns some lines upside down, which the
  recogniser then reads as garbage with scores around 0.6.
- **Device.** ``cpu`` never asks for CUDA; ``auto`` and ``cuda`` ask for it when onnxruntime
  offers ``CUDAExecutionProvider``. The device reported is the one every session actually got
  (its first provider), not the one asked for.
- **Abort.** Every ``session.run`` gets its own ``onnxruntime.RunOptions``; ``Cancel.set`` sets
  ``terminate`` on them, so a timed-out or interrupted job stops inside the running stage and
  every later stage fails at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from PIL import Image

log = logging.getLogger("modelforge.worker.ocr")

CUDA_PROVIDER = "CUDAExecutionProvider"
#: Detection input: the longer side scaled down to at most this many pixels (rapidocr's own
#: default scales the *shorter* side up to 736, which makes a wide 900x120 line 5520x736 and
#: costs ~10x the time for no gain on printed text).
DET_LIMIT_SIDE = 960


class DownloadRefused(RuntimeError):
    """rapidocr tried to download something: the worker never does."""


class JobCancelled(Exception):
    """The job was aborted (timeout, shutdown or cancel) while it ran."""


def refuse_downloads() -> None:
    """Replace rapidocr's downloader (the only code of it that fetches files) with a refusal."""
    from rapidocr.utils import download_file  # type: ignore[import-untyped]

    def refuse(cls: Any, params: Any) -> None:
        raise DownloadRefused(
            f"rapidocr tried to download {getattr(params, 'file_url', '?')}; the worker never downloads"
        )

    download_file.DownloadFile.run = classmethod(refuse)  # type: ignore[method-assign,assignment]


class Cancel:
    """A job's abort switch, shared by the job and whoever may abort it (its deadline, a stop, a
    cancel). A job that waits waits on it (``wait``), so an abort ends the wait at once."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._set = False
        self._event = threading.Event()
        self._options: list[Any] = []

    def is_set(self) -> bool:
        with self._guard:
            return self._set

    def set(self) -> None:
        with self._guard:
            self._set = True
            self._event.set()
            for options in self._options:
                options.terminate = True

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds``; whether the job was aborted meanwhile (True at once if it was)."""
        return self._event.wait(seconds)

    def run_options(self, factory: Any) -> Any:
        with self._guard:
            options = factory()
            options.terminate = self._set
            self._options.append(options)
            return options


class _AbortableSession:
    """An ``onnxruntime.InferenceSession`` whose ``run`` honours the engine's current ``Cancel``."""

    def __init__(self, inner: Any, engine: OcrEngine) -> None:
        self._inner = inner
        self._engine = engine

    def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
        cancel = self._engine.cancel
        options = cancel.run_options(self._engine.ort.RunOptions) if cancel is not None else run_options
        return self._inner.run(output_names, input_feed, options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ModelLoadFailed(Exception):
    """The models could not be loaded; ``reason`` is what the capability reports."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


#: rapidocr's configuration section of each model's stage.
_SECTIONS = {"det": "Det", "cls": "Cls", "rec": "Rec"}


class OcrEngine:
    """RapidOCR with the three ``models`` (role -> the ONNX file's verified bytes), on ``device``
    (auto, cpu, cuda); ``threads``: onnxruntime's intra-op threads per session (None: its default,
    every core)."""

    def __init__(self, models: dict[str, bytes], device: str, threads: int | None = None) -> None:
        _warn_about_two_runtimes()
        try:
            import onnxruntime  # type: ignore[import-untyped]

            refuse_downloads()
            from rapidocr import RapidOCR
        except ImportError as error:
            raise ModelLoadFailed("runtime_unavailable", f"cannot import the OCR runtime: {error}") from error
        self.ort = onnxruntime
        self.cancel: Cancel | None = None
        offered = list(onnxruntime.get_available_providers())
        want_cuda = device in ("auto", "cuda") and CUDA_PROVIDER in offered
        if device == "cuda" and not want_cuda:
            raise ModelLoadFailed("cuda_unavailable", f"onnxruntime offers no {CUDA_PROVIDER} (it offers {offered})")
        params = {
            "Global.log_level": "warning",
            "Det.limit_type": "max",
            "Det.limit_side_len": DET_LIMIT_SIDE,
            "EngineConfig.onnxruntime.use_cuda": want_cuda,
            # one search per shape, not an exhaustive one: image sizes vary from job to job
            "EngineConfig.onnxruntime.cuda_ep_cfg.cudnn_conv_algo_search": "HEURISTIC",
        }
        if threads is not None:
            params["EngineConfig.onnxruntime.intra_op_num_threads"] = threads
        _route_rapidocr_logs()
        try:
            engine = RapidOCR(params=params)
            _give_sessions(engine, models, onnxruntime)
            stages = [engine._load_det_model(), engine._load_cls_model(), engine._load_rec_model()]
        except DownloadRefused as refused:
            raise ModelLoadFailed("model_load_failed", str(refused)) from refused
        except Exception as error:  # noqa: BLE001 - any load failure makes the capability unavailable
            raise ModelLoadFailed("model_load_failed", f"{type(error).__name__}: {error}") from error
        providers = []
        for stage in stages:
            session = stage.session.session  # rapidocr's OrtInferSession -> onnxruntime's InferenceSession
            providers.append(session.get_providers()[0])
            stage.session.session = _AbortableSession(session, self)
        self.device = "cuda" if all(provider == CUDA_PROVIDER for provider in providers) else "cpu"
        if device == "cuda" and self.device != "cuda":
            raise ModelLoadFailed(
                "cuda_unavailable", f"the sessions did not get {CUDA_PROVIDER} (they got {providers})"
            )
        self.providers = providers
        self._engine = engine

    def recognise(self, image: Image.Image, cancel: Cancel, detect_rotation: bool = False) -> list[dict[str, Any]]:
        """The text lines found in ``image``: text, score and the 4-point box (pixels of the input);
        ``detect_rotation``: run the orientation classifier (lines upside down are turned)."""
        self.cancel = cancel
        try:
            output = self._engine(image, use_cls=detect_rotation)
        except Exception as error:
            if cancel.is_set():
                raise JobCancelled() from error
            raise
        finally:
            self.cancel = None
        if cancel.is_set():
            raise JobCancelled()
        texts, scores, boxes = (
            getattr(output, "txts", None),
            getattr(output, "scores", None),
            getattr(output, "boxes", None),
        )
        if texts is None or scores is None or boxes is None:
            return []
        return [
            {
                "text": str(text),
                "score": round(float(score), 5),
                "box": [[round(float(x), 1), round(float(y), 1)] for x, y in box.tolist()],
            }
            for text, score, box in zip(texts, scores, boxes, strict=True)
        ]


def _give_sessions(engine: Any, models: dict[str, bytes], onnxruntime: Any) -> None:
    """One ``InferenceSession`` per stage, made from ``models``' bytes with the session options
    and providers rapidocr would use, set as the stage's ``session`` (which rapidocr then uses
    instead of opening a file)."""
    from omegaconf import flag_override
    from rapidocr.inference_engine.onnxruntime.main import OrtInferSession  # type: ignore[import-untyped]
    from rapidocr.inference_engine.onnxruntime.provider_config import ProviderConfig  # type: ignore[import-untyped]

    for role, section in _SECTIONS.items():
        engine_cfg = engine.cfg.EngineConfig[engine.cfg[section].engine_type.value]
        session = onnxruntime.InferenceSession(
            models[role],
            sess_options=OrtInferSession._init_sess_opts(engine_cfg),
            providers=ProviderConfig(engine_cfg=engine_cfg).get_ep_list(),
        )
        with flag_override(engine.cfg, "allow_objects", True):  # a session is no plain config value
            engine.cfg[section].session = session


def _warn_about_two_runtimes() -> None:
    """onnxruntime and onnxruntime-gpu install the same ``onnxruntime`` package over each other;
    with both present, which one runs depends on the order they were installed in."""
    from importlib import metadata

    present = []
    for name in ("onnxruntime", "onnxruntime-gpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            present.append(f"{name} {metadata.version(name)}")
    if len(present) == 2:
        log.warning(
            f"both {present[0]} and {present[1]} are installed; keep one (README.md, Installing)",
            extra={"event": "onnxruntime_conflict"},
        )


def _route_rapidocr_logs() -> None:
    """rapidocr logs through its own coloured handler; send its warnings and errors to ours."""
    from modelforge_logging import jsonlog

    rapid = logging.getLogger("RapidOCR")
    for handler in list(rapid.handlers):
        if not getattr(handler, "_modelforge", False):
            rapid.removeHandler(handler)
    jsonlog.configure("WARNING", logger_name="RapidOCR")
