#!/usr/bin/env python
"""OCR benchmark: images per second and latency of the runtime worker through its real HTTP API.

Run from the repository root:

    .venv/bin/python bench/ocr.py [--images 30] [--seconds 60] [--warmup 2] [--lines 3] [--slots 1]

It starts the worker (``python -m modelforge_runtime_worker.main``) as a subprocess on a unix
socket in a temporary directory, with its artifact and quarantine roots there too (so the first
start copies the models out of the rapidocr wheel, as on a new host), waits for its
``worker listening on ...`` line, checks that it reports ``ocr`` available, and sends one
synthetic page after another (black text on white rendered with Pillow, PNG, ``--lines`` lines)
as ``POST /v1/run`` with capability ``ocr``. For each number of slots from 1 to ``--slots`` it
starts a worker with ``MODELFORGE_WORKER_SLOTS`` set to it and sends from as many clients at once,
each one request at a time. The first ``--warmup`` requests of each client are not counted. It
stops after ``--images`` timed requests or ``--seconds``, whichever comes first, and prints for
each device and number of slots:

* images per second over the timed requests (timed images / the timed phase's wall time);
* client latency p50 and p99 in ms (the whole HTTP request over the socket; with fewer than 100
  images p99 is close to the maximum), and the worker's own ``duration_ms`` p50 (decode + OCR);
* the device the worker reported in its results.

It runs on CPU (``MODELFORGE_WORKER_DEVICE=cpu``) always, then on CUDA
(``MODELFORGE_WORKER_DEVICE=cuda``) when onnxruntime here offers ``CUDAExecutionProvider``;
otherwise the CUDA row says why it was skipped. Every answer must be 200 with the rendered text
read back (case and spacing aside), else it exits 1 with a ``bench/ocr.py: FAILED: ...`` line.
The worker is stopped by its PID (SIGTERM, SIGKILL after 10 s) whatever happens.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.support import BenchFailure, Child, child_environment, start_child, stop_child, wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
LISTENING_RE = re.compile(r"worker listening on (\S+), capabilities: ([^\"]*)\"")
MAX_IMAGES, MAX_SECONDS, MAX_WARMUP, MAX_LINES, MAX_SLOTS = 1000, 600, 20, 40, 8
START_TIMEOUT = 120.0
STOP_TIMEOUT = 10.0
REQUEST_TIMEOUT = 120.0
CUDA_PROVIDER = "CUDAExecutionProvider"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=30, help=f"timed requests per device (1..{MAX_IMAGES})")
    parser.add_argument(
        "--seconds", type=float, default=60.0, help=f"time bound of the timed requests per device (1..{MAX_SECONDS})"
    )
    parser.add_argument("--warmup", type=int, default=2, help=f"untimed requests first (0..{MAX_WARMUP})")
    parser.add_argument("--lines", type=int, default=3, help=f"text lines on the page (1..{MAX_LINES})")
    parser.add_argument(
        "--slots",
        type=int,
        default=1,
        help=f"measure 1 to this many worker slots, as many clients at once (1..{MAX_SLOTS})",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.images <= MAX_IMAGES:
        parser.error(f"--images must be from 1 to {MAX_IMAGES}")
    if not 1 <= args.seconds <= MAX_SECONDS:  # also refuses nan
        parser.error(f"--seconds must be from 1 to {MAX_SECONDS}")
    if not 0 <= args.warmup <= MAX_WARMUP:
        parser.error(f"--warmup must be from 0 to {MAX_WARMUP}")
    if not 1 <= args.lines <= MAX_LINES:
        parser.error(f"--lines must be from 1 to {MAX_LINES}")
    if not 1 <= args.slots <= MAX_SLOTS:
        parser.error(f"--slots must be from 1 to {MAX_SLOTS}")
    return args


def page(lines: int) -> tuple[bytes, list[str], tuple[int, int]]:
    """A PNG of ``lines`` lines of black text on white, the texts, and its size."""
    from PIL import Image, ImageDraw, ImageFont

    texts = [f"INVOICE {2026 + number} TOTAL {1234 + number * 7}.56 EUR" for number in range(lines)]
    font = ImageFont.load_default(size=32)
    size = (900, 40 + 52 * lines)
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for number, text in enumerate(texts):
        draw.text((24, 20 + 52 * number), text, fill="black", font=font)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue(), texts, size


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text).upper()


@dataclass
class Figures:
    device: str
    slots: int
    latencies_ms: list[float]
    worker_ms: list[float]
    elapsed: float


def measure(
    device: str,
    slots: int,
    args: argparse.Namespace,
    scratch: Path,
    children: list[Child],
    body: bytes,
    texts: list[str],
) -> Figures:
    folder = scratch / f"{device}-{slots}"
    folder.mkdir()
    env = child_environment(
        {
            "MODELFORGE_WORKER_LISTEN": f"unix://{folder / 'worker.sock'}",
            "MODELFORGE_WORKER_ARTIFACT_ROOT": str(folder / "artifacts"),
            "MODELFORGE_WORKER_QUARANTINE_ROOT": str(folder / "quarantine"),
            "MODELFORGE_WORKER_DEVICE": device,
            "MODELFORGE_WORKER_SLOTS": str(slots),
        }
    )
    started = time.monotonic()
    worker = start_child(f"{device} worker", [sys.executable, "-m", "modelforge_runtime_worker.main"], env, REPO_ROOT)
    children.append(worker)

    def listening() -> re.Match[str] | None:
        return next((m for line in worker.lines() if (m := LISTENING_RE.search(line))), None)

    match = wait_for(listening, START_TIMEOUT, [worker], "worker listening line")
    address, capabilities = match.group(1), match.group(2)
    print(
        f"  {device}, {slots} slot(s): worker ready in {time.monotonic() - started:.1f} s"
        f" (first start: models copied, verified, loaded in each slot); capabilities: {capabilities}"
    )
    if not capabilities.startswith(f"ocr ({device})"):
        raise BenchFailure(f"the {device} worker does not offer ocr on {device}: {capabilities}")
    load = _Load(address, args, body, texts)
    elapsed = load.run(slots)
    print(f"  {device}, {slots} slot(s): worker {stop_child(worker, STOP_TIMEOUT)}")
    children.remove(worker)
    if load.problems:
        raise BenchFailure(load.problems[0])
    if load.reported != {device}:
        raise BenchFailure(f"asked for {device}, the worker reported {sorted(load.reported)}")
    return Figures(device, slots, load.latencies, load.worker_ms, elapsed)


class _Load:
    """``clients`` clients at once, each one request at a time, until ``--images`` timed requests
    in all or ``--seconds``."""

    def __init__(self, address: str, args: argparse.Namespace, body: bytes, texts: list[str]) -> None:
        self.address, self.args, self.body, self.texts = address, args, body, texts
        self.guard = threading.Lock()
        self.latencies: list[float] = []
        self.worker_ms: list[float] = []
        self.reported: set[str] = set()
        self.problems: list[str] = []
        self.window = time.monotonic()
        self.started = 0

    def run(self, clients: int) -> float:
        # the timed phase starts when every client has warmed up (the barrier's action runs first)
        warm = threading.Barrier(
            clients + 1, action=self._start_window, timeout=REQUEST_TIMEOUT * (self.args.warmup + 1)
        )
        threads = [threading.Thread(target=self._client, args=(warm,), daemon=True) for _ in range(clients)]
        for thread in threads:
            thread.start()
        with contextlib.suppress(threading.BrokenBarrierError):  # a client failed: its problem is reported
            warm.wait()
        for thread in threads:
            thread.join(self.args.seconds + REQUEST_TIMEOUT)
        return time.monotonic() - self.window

    def _start_window(self) -> None:
        self.window = time.monotonic()

    def _client(self, warm: threading.Barrier) -> None:
        from modelforge_runtime_worker.client import WorkerClient

        client = WorkerClient(self.address, timeout=REQUEST_TIMEOUT, keep_alive=True)
        try:
            for _ in range(self.args.warmup):
                _one(client, self.body, self.texts)
            warm.wait()
            while True:
                with self.guard:  # a request is counted when it starts, so no more than --images go
                    if self.started >= self.args.images or time.monotonic() - self.window >= self.args.seconds:
                        return
                    self.started += 1
                began = time.perf_counter()
                result = _one(client, self.body, self.texts)
                with self.guard:
                    self.latencies.append((time.perf_counter() - began) * 1000)
                    self.worker_ms.append(float(result["duration_ms"]))
                    self.reported.add(str(result["device"]))
        except (BenchFailure, threading.BrokenBarrierError, OSError) as failed:
            warm.abort()  # the others stop waiting for this client
            with self.guard:
                self.problems.append(str(failed) or type(failed).__name__)
        finally:
            client.close()


def _one(client: Any, body: bytes, texts: list[str]) -> dict[str, Any]:
    answer = client.request("POST", "/v1/run", body)
    if answer.status != 200:
        raise BenchFailure(f"POST /v1/run answered {answer.status}: {answer.raw[:300]!r}")
    result = answer.body["result"]
    read = _squash("".join(line["text"] for line in result["lines"]))
    if read != _squash("".join(texts)):
        raise BenchFailure(f"the page read back as {read!r}, not {_squash(''.join(texts))!r}")
    return result


def cuda_offered() -> tuple[bool, str]:
    try:
        import onnxruntime
    except ImportError as error:
        return False, f"onnxruntime cannot be imported ({error})"
    providers = onnxruntime.get_available_providers()
    if CUDA_PROVIDER in providers:
        return True, ""
    gpu = any(Path("/dev").glob("nvidia[0-9]*"))
    why = f"onnxruntime here offers no {CUDA_PROVIDER} ({', '.join(providers)})"
    return False, why + (
        "; an NVIDIA GPU is present: install the worker's cuda extra (onnxruntime-gpu)" if gpu else "; no GPU"
    )


def run(args: argparse.Namespace, children: list[Child], scratch: Path) -> int:
    from modelforge_runtime_worker import WORKER_VERSION

    body_image, texts, size = page(args.lines)
    body = json.dumps({"capability": "ocr", "input": {"image_base64": base64.b64encode(body_image).decode()}}).encode()
    print(
        f"ModelForge OCR benchmark: worker {WORKER_VERSION}, page {size[0]}x{size[1]} PNG with {args.lines} text"
        f" lines ({len(body_image) // 1024} KiB), {args.warmup} warm-up + up to {args.images} timed requests or"
        f" {args.seconds:g} s per device and slot count; 1 to {args.slots} slot(s), as many clients at once,"
        " each one request at a time, over a unix socket"
    )
    offered, why = cuda_offered()
    devices = ["cpu", "cuda"] if offered else ["cpu"]
    rows = [
        measure(device, slots, args, scratch, children, body, texts)
        for device in devices
        for slots in range(1, args.slots + 1)
    ]
    print()
    print(
        f"{'device':<7}{'slots':>6}{'images':>7}{'seconds':>9}{'images/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'worker p50 ms':>15}"
    )
    for row in rows:
        count = len(row.latencies_ms)
        rate = count / row.elapsed if row.elapsed > 0 else 0.0
        p50, p99 = _support.percentile(row.latencies_ms, 50), _support.percentile(row.latencies_ms, 99)
        print(
            f"{row.device:<7}{row.slots:>6}{count:>7}{row.elapsed:>9.1f}{rate:>10.2f}{p50:>9.0f}"
            f"{p99:>9.0f}{_support.percentile(row.worker_ms, 50):>15.0f}"
        )
    if not offered:
        print(f"{'cuda':<7}skipped: {why}")
    return 0


def _run_in_scratch(args: argparse.Namespace) -> int:
    _support.install_sigterm_handler()
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="mf-ocr-bench-") as scratch:
        try:
            return run(args, children, Path(scratch))
        finally:
            for child in children:
                if child.exited() is None:
                    print(
                        f"stopping the {child.name} (PID {child.pid}): {stop_child(child, STOP_TIMEOUT)}",
                        file=sys.stderr,
                    )


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("ocr.py", parse_args, _run_in_scratch, argv)


if __name__ == "__main__":
    sys.exit(main())
