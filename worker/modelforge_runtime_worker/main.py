"""Entry point: ``python3 -m modelforge_runtime_worker.main`` (also ``modelforge-runtime-worker``).

Order on every start, each step able to stop it before the next: the whole configuration
(exit 2, before anything is created), the listening socket (exit 3 when another worker answers
there or the path is not a socket), the artifact root checked against its manifest (exit 4 when
it cannot be created or written), the job slots started (``MODELFORGE_WORKER_SLOTS`` processes,
each loading the models from files it verified itself: ``slots.py``; exit 1 if one does not come
up; a GPU's own slot starts on the first run that names that GPU), then serving. The worker logs
one line, ``worker listening on <address>, capabilities: ...``, when it serves.

SIGTERM/SIGINT: stop accepting, abort the running jobs (they get 503 ``shutting_down``), end the
slot processes, remove the unix socket and exit 0 within a few seconds.

Exit codes: 0 clean stop, 1 unexpected, 2 configuration invalid, 3 cannot listen, 4 artifact
storage unusable.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from modelforge_logging import jsonlog
from modelforge_protocol import environment

from . import WORKER_PROTOCOL_VERSION, WORKER_VERSION
from .artifacts import Artifacts, StorageUnusable, bundled_models_dir
from .capabilities import Capability
from .config import DEFAULTS, LOG_LEVEL, WorkerConfig, load_config
from .errors import ConfigurationInvalid, ListenFailed
from .jobs import JobRunner
from .server import Listener, WorkerApp
from .slots import SlotDown, SlotProcesses, threads_per_slot

log = logging.getLogger("modelforge.worker")

OK, UNEXPECTED, CONFIGURATION_INVALID, LISTEN_FAILED, STORAGE_UNUSABLE = 0, 1, 2, 3, 4
#: How long a stop waits for the running job to end once it is aborted.
STOP_GRACE_SECONDS = 3.0
#: How long a stop then waits for requests in flight to be answered.
ANSWER_GRACE_SECONDS = 1.0
#: How often the main thread wakes to run signal handlers.
SIGNAL_CHECK_SECONDS = 0.25
_abandoned = threading.Event()


def _exit(code: int, message: str) -> int:
    log.error(message, extra={"event": "worker_exit", "exit_code": code})
    return code


def summary(capabilities: Sequence[Capability]) -> str:
    """``ocr (cpu), diagnostic.echo``: a model capability with its device, or why it is unavailable."""
    parts = []
    for capability in capabilities:
        if not capability.available:
            parts.append(f"{capability.name} (unavailable: {capability.reason})")
        elif capability.model_sha256 is None:
            parts.append(capability.name)
        else:
            parts.append(f"{capability.name} ({capability.device})")
    return ", ".join(parts)


def serve(config: WorkerConfig, stop: threading.Event) -> int:
    """Run a validated configuration until ``stop`` is set."""
    try:
        listener = Listener(config.listen)
    except ListenFailed as failed:
        return _exit(LISTEN_FAILED, failed.message)
    try:
        artifacts = Artifacts(config.artifact_root, config.quarantine_root, bundle_dir=bundled_models_dir())
        try:
            state = artifacts.prepare()
        except StorageUnusable as unusable:
            return _exit(STORAGE_UNUSABLE, unusable.message)
        if state.usable:
            log.debug("artifacts verified", extra={"event": "artifacts_verified", "model_sha256": state.model_sha256})
        slots = SlotProcesses(config.slots, slot_start(config))
        try:
            capabilities: list[Capability] = list(slots.start())
        except SlotDown as down:
            slots.stop()
            return _exit(UNEXPECTED, f"a job slot did not start: {down}")
        jobs = JobRunner(config.job_timeout_seconds, config.slots, slots.execute)
        app = WorkerApp(capabilities, jobs)
        if stop.is_set():
            slots.stop()
            return OK
        listener.serve(app)
        # the one line an operator looks for: shown at any log level
        log.log(
            max(logging.INFO, log.getEffectiveLevel()),
            f"worker listening on {listener.address}, capabilities: {summary(capabilities)}",
            extra={
                "event": "worker_listening",
                "listen": listener.address,
                "worker_version": WORKER_VERSION,
                "protocol_version": WORKER_PROTOCOL_VERSION,
                "pid": os.getpid(),
                "capabilities": [capability.name for capability in capabilities if capability.available],
                "slots": config.slots,
                "slot_pids": [slot.pid for slot in slots.slots],
            },
        )
        # A timed wait: Python runs signal handlers on the main thread only, between waits.
        while not stop.wait(SIGNAL_CHECK_SECONDS):
            pass
        app.stopping = True
        listener.close()  # stop accepting first; the unix socket file goes with it
        ended = jobs.stop(STOP_GRACE_SECONDS)
        slots.stop()
        app.wait_answered(ANSWER_GRACE_SECONDS)  # the aborted jobs' callers get their 503
        if not ended:
            log.warning("the running job did not end after its abort; exiting anyway", extra={"event": "job_abandoned"})
            _abandoned.set()
        log.info("stopped", extra={"event": "worker_stopped"})
        return OK
    finally:
        listener.close()


def slot_start(config: WorkerConfig, cores: int | None = None) -> dict[str, Any]:
    """What each slot process is told when it starts (its start frame): ``cores`` (this process's
    CPUs by default) are shared among the slots' onnxruntime sessions."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return {
        "threads": threads_per_slot(config.slots, cores),
        "artifact_root": str(config.artifact_root),
        "quarantine_root": str(config.quarantine_root),
        "device": config.device,
        "decode_timeout_seconds": config.decode_timeout_seconds,
        "decode_memory_bytes": config.decode_memory_bytes,
        "log_level": config.log_level,
    }


def start(env: Mapping[str, str], stop: threading.Event) -> int:
    """Validate the whole configuration, then serve; nothing is touched before it is valid."""
    for name, warning in environment.unknown_variable_warnings(env):  # a misspelling may be why one is missing
        log.warning(warning, extra={"event": "unknown_setting", "variable": name})
    try:
        config = load_config(env)
    except ConfigurationInvalid as invalid:
        return _exit(CONFIGURATION_INVALID, invalid.message)
    jsonlog.configure(config.log_level)
    try:
        return serve(config, stop)
    except Exception as error:  # noqa: BLE001 - reported with its traceback, exit 1
        log.error("unexpected error", exc_info=error, extra={"event": "worker_crashed"})
        return UNEXPECTED


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="modelforge-runtime-worker",
        description="ModelForge runtime worker: serves model capabilities to the node agent (configured by "
        f"environment: {', '.join(DEFAULTS)})",
    )
    parser.add_argument("--version", action="version", version=f"modelforge-runtime-worker {WORKER_VERSION}")
    parser.parse_args(argv)
    env = os.environ
    jsonlog.configure(env.get(LOG_LEVEL, "INFO").strip().upper() or "INFO")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    code = start(env, stop)
    if _abandoned.is_set():
        # the abandoned job's thread may be inside onnxruntime: never finalise the interpreter under it
        logging.shutdown()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
