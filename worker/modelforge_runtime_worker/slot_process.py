"""One job slot's process: ``python -m modelforge_runtime_worker.slot_process`` (started by
``slots.py``, never by hand).

It dies with the worker (``child_process``), reads its start frame (where the artifacts are, the
device, the decoder's limits, the log level), checks the artifact root against its manifest and
loads the capabilities once (so a slot loads its models from files it verified itself), says
``ready`` with what it runs, and then runs one job per ``run`` frame on its main thread, answering
``done`` with the result or ``error`` with the worker's own error code. Nothing stops a job from
inside: the worker kills the whole process at the job's deadline or on a cancel, and starts a new
one. stdout carries frames only: the process's file descriptor 1 is pointed at stderr before any
library can print to it.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import IO, Any

from modelforge_logging import jsonlog

from .artifacts import Artifacts, StorageUnusable, bundled_models_dir
from .capabilities import Capability, Echo, Ocr, Sleep, describe
from .child_process import die_with_parent
from .errors import RunError
from .ocr import Cancel
from .slot_frames import FrameError, read_frame, write_frame

log = logging.getLogger("modelforge.worker.slot")

#: Exit statuses: the worker went away (its end of the pipe closed), or the artifacts are unusable.
GONE, STORAGE_UNUSABLE = 0, 4


def load(start: dict[str, Any]) -> list[Capability]:
    """The slot's capabilities, from the start frame."""
    artifacts = Artifacts(Path(start["artifact_root"]), Path(start["quarantine_root"]), bundle_dir=bundled_models_dir())
    state = artifacts.prepare()
    ocr = Ocr(
        state,
        artifacts,
        start["device"],
        start["decode_timeout_seconds"],
        start["decode_memory_bytes"],
        start.get("threads"),
    )
    return [ocr, Echo(), Sleep()]


def answer(capabilities: dict[str, Capability], request: dict[str, Any]) -> dict[str, Any]:
    """The frame that answers one ``run`` frame."""
    capability = capabilities.get(str(request.get("capability")))
    payload = request.get("input")
    if capability is None or not isinstance(payload, dict):
        return {
            "type": "error",
            "code": "invalid_request",
            "message": "the slot got a malformed run",
            "retryable": False,
        }
    try:
        return {"type": "done", "result": capability.run(payload, Cancel())}
    except RunError as refused:
        return {"type": "error", "code": refused.code, "message": refused.message, "retryable": refused.retryable}
    except Exception as error:  # noqa: BLE001 - the capability's bug: logged here, job_failed there
        log.error("job failed", exc_info=error, extra={"event": "job_failed", "capability": capability.name})
        message = f"{capability.name} failed ({type(error).__name__})"
        return {"type": "error", "code": "job_failed", "message": message, "retryable": False}


def serve(frames_in: IO[bytes], frames_out: IO[bytes]) -> int:
    start = read_frame(frames_in)
    jsonlog.configure(str(start.get("log_level", "INFO")))
    try:
        loaded = load(start)
    except StorageUnusable as unusable:
        log.error(unusable.message, extra={"event": "slot_exit", "exit_code": STORAGE_UNUSABLE})
        return STORAGE_UNUSABLE
    capabilities = {capability.name: capability for capability in loaded}
    write_frame(frames_out, {"type": "ready", "pid": os.getpid(), "capabilities": [describe(c) for c in loaded]})
    while True:
        try:
            request = read_frame(frames_in)
        except FrameError:
            return GONE  # the worker closed our stdin: it is stopping, or gone
        write_frame(frames_out, answer(capabilities, request))


def main() -> int:
    die_with_parent()
    frames_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a library that prints now prints to stderr, never into the frames
    sys.stdout = sys.stderr
    try:
        return serve(sys.stdin.buffer, frames_out)
    except FrameError:
        return GONE


if __name__ == "__main__":
    raise SystemExit(main())
