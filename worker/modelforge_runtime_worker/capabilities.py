"""What the worker can run: ``ocr`` (RapidOCR), ``diagnostic.echo`` and ``diagnostic.sleep`` (no
model, always there).

A capability reports what ``GET /v1/status`` shows (model, model digest, device, whether it is
available and why not) and runs one job's input into a result. Input problems are
``InvalidInput``; an unavailable capability refuses every run (``CapabilityUnavailable``), never
retryable (``artifact_quarantined`` when its files were quarantined, ``capability_unavailable``
otherwise).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from modelforge_protocol import work
from modelforge_protocol.canonical import canonical_bytes

from .artifacts import QUARANTINED, RAPIDOCR_VERSION, Artifacts, ArtifactState
from .decoder import DEFAULT_MEMORY_BYTES, DEFAULT_TIMEOUT_SECONDS, decode_image
from .errors import CapabilityUnavailable, invalid_input
from .ocr import Cancel, JobCancelled, ModelLoadFailed, OcrEngine

log = logging.getLogger("modelforge.worker")

OCR = "ocr"
ECHO = "diagnostic.echo"
SLEEP = "diagnostic.sleep"
OCR_MODEL = f"rapidocr-{RAPIDOCR_VERSION}/PP-OCRv6-small"
#: ``ocr``'s input fields.
OCR_FIELDS = ("image_base64", "detect_rotation")
#: What a line's ``score`` means, in every ``ocr`` result (and worker/README.md).
SCORE_NOTE = (
    "score: the recogniser's confidence in the line's text, 0-1 (lines under 0.5 are left out); under 0.8 the "
    "line is likely misread. On pages with turned lines, run with detect_rotation: true."
)
#: What the reasons mean, for the refusal's message.
REASONS = {
    QUARANTINED: "its model files did not match the artifact manifest and were quarantined (see the worker's log "
    "and the quarantine root)",
    "bundled_models_unavailable": "the installed rapidocr wheel does not hold the models this release runs",
    "cuda_unavailable": "MODELFORGE_WORKER_DEVICE=cuda but onnxruntime offers no CUDA execution provider",
    "model_load_failed": "its models could not be loaded (see the worker's log)",
    "runtime_unavailable": "onnxruntime or rapidocr cannot be imported",
}


class Capability(Protocol):
    name: str
    model: str
    model_sha256: str | None
    device: str
    available: bool
    reason: str | None

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]: ...


def describe(capability: Capability) -> dict[str, Any]:
    """The capability as ``GET /v1/status`` lists it."""
    return {
        "name": capability.name,
        "model": capability.model,
        "model_sha256": capability.model_sha256,
        "device": capability.device,
        "available": capability.available,
        "reason": capability.reason,
    }


def refuse_unavailable(capability: Capability) -> CapabilityUnavailable:
    reason = capability.reason or "unavailable"
    code = QUARANTINED if reason == QUARANTINED else "capability_unavailable"
    return CapabilityUnavailable(f"{capability.name} is unavailable ({reason}): {REASONS.get(reason, reason)}", code)


class Echo:
    """``diagnostic.echo``: the SHA-256 of the input's canonical JSON. Proves the path from the
    agent to the worker and back without a model."""

    name = ECHO
    model = "builtin"
    model_sha256: str | None = None
    device = "cpu"
    available = True
    reason: str | None = None

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        return {"sha256": hashlib.sha256(canonical_bytes(payload, ascii_only=True)).hexdigest(), "device": "cpu"}


class Sleep:
    """``diagnostic.sleep``: waits ``seconds`` (0 to ``MAX_SLEEP_SECONDS``) and says how long it
    slept. Holds the worker's slot on purpose (tests, benches); its job's deadline, a stop or a
    cancel ends the wait at once."""

    name = SLEEP
    model = "builtin"
    model_sha256: str | None = None
    device = "cpu"
    available = True
    reason: str | None = None

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        seconds = sleep_seconds(payload)
        started = self._clock()
        if cancel.wait(seconds):
            raise JobCancelled()
        return {"slept_seconds": round(self._clock() - started, 3), "device": "cpu"}


def sleep_seconds(payload: dict[str, Any]) -> float:
    """``diagnostic.sleep``'s input: ``{"seconds": <number 0..MAX_SLEEP_SECONDS>}``, nothing else."""
    unknown = sorted(set(payload) - {"seconds"})
    if unknown:
        raise invalid_input(f"input has unknown fields: {', '.join(unknown)} (diagnostic.sleep takes seconds only)")
    seconds = payload.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise invalid_input("input/seconds is required: a number of seconds")
    if not 0 <= seconds <= work.MAX_SLEEP_SECONDS:
        raise invalid_input(f"input/seconds must be between 0 and {work.MAX_SLEEP_SECONDS}")
    return float(seconds)


class Ocr:
    """``ocr``: text lines of a PNG or JPEG image. Loaded at start only from verified files."""

    name = OCR
    model = OCR_MODEL

    def __init__(
        self,
        state: ArtifactState,
        artifacts: Artifacts,
        device: str,
        decode_timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        decode_memory_bytes: int = DEFAULT_MEMORY_BYTES,
        threads: int | None = None,
    ) -> None:
        self.model_sha256: str | None = state.model_sha256
        #: the image decoder's child process: its time cap and memory limit (decoder.py)
        self._decode_timeout, self._decode_memory = decode_timeout_seconds, decode_memory_bytes
        #: onnxruntime's intra-op threads per session (None: every core; slots.threads_per_slot)
        self._threads = threads
        # before loading, the device it would use; after, the one it got
        self.device = "cuda" if device == "cuda" else "cpu"
        self.available = False
        self.reason: str | None = state.reason
        self._engine: OcrEngine | None = None
        if state.usable:
            self._load(state, artifacts, device)

    def _load(self, state: ArtifactState, artifacts: Artifacts, device: str) -> None:
        started = time.monotonic()
        models = artifacts.read_models(state)  # the bytes that were hashed are the ones loaded
        if models is None:  # a file changed since the start-up check: quarantined
            self.reason = state.reason
            return
        try:
            engine = OcrEngine(models, device, self._threads)
        except ModelLoadFailed as failed:
            self.reason = failed.reason
            log.error(
                f"ocr unavailable: {failed.detail}",
                extra={"event": "capability_unavailable", "capability": OCR, "reason": failed.reason},
            )
            return
        self._engine, self.device, self.available, self.reason = engine, engine.device, True, None
        log.info(
            "ocr models loaded",
            extra={
                "event": "capability_loaded",
                "capability": OCR,
                "device": engine.device,
                "providers": engine.providers,
                "model_sha256": self.model_sha256,
                "duration_ms": round((time.monotonic() - started) * 1000, 2),
            },
        )

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        if self._engine is None:
            raise refuse_unavailable(self)
        unknown = sorted(set(payload) - set(OCR_FIELDS))
        if unknown:
            raise invalid_input(
                f"input has unknown fields: {', '.join(unknown)} (ocr takes {' and '.join(OCR_FIELDS)} only)"
            )
        detect_rotation = payload.get("detect_rotation", False)
        if not isinstance(detect_rotation, bool):
            raise invalid_input("input/detect_rotation must be true or false (default false)")
        started = time.monotonic()
        image = decode_image(
            payload.get("image_base64"), timeout_seconds=self._decode_timeout, memory_bytes=self._decode_memory
        )
        lines = self._engine.recognise(image, cancel, detect_rotation)
        return {
            "lines": lines,
            "device": self.device,
            "model_sha256": self.model_sha256,
            "duration_ms": round((time.monotonic() - started) * 1000, 2),
            "detect_rotation": detect_rotation,
            "score_note": SCORE_NOTE,
        }
