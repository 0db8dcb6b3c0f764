"""Untrusted images are decoded in a short-lived child process, under a memory limit and a time cap.

Pillow decodes an image in one call that nothing in the calling process can interrupt, and the
pixel cap (``images.MAX_PIXELS``, checked from the header) does not bound the work: a 266 KB
progressive JPEG whose last scan repeats thousands of times passes the cap and holds its decoder
for minutes. So the worker never decodes in its own process. ``decode_image`` hands the file to a
child (``python -m modelforge_runtime_worker.decoder``) that

- limits its own address space (``RLIMIT_AS``) and CPU time (``RLIMIT_CPU``) before it reads a
  byte, so a decompression bomb ends as a clear failure, not an out-of-memory kill of the node;
- dies with its parent (``PR_SET_PDEATHSIG``), so a job process that is killed takes its decoder
  with it;
- writes only pixels back: a fixed header (magic, width, height) and ``width * height * 3`` bytes
  of RGB.

The parent waits at most ``timeout_seconds`` and then kills it (SIGKILL). Every way the child can
fail is the input's fault, and not retryable: ``InvalidInput`` with what went wrong. The GPU slot
processes are not run under ``RLIMIT_AS`` (it breaks CUDA's initialisation); only this child is.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from typing import Any

from PIL import Image

from .child_process import die_with_parent, signal_name
from .errors import invalid_input

#: The decoder's address-space limit by default (1 GiB: a 25-megapixel progressive JPEG needs about
#: 400 MB of coefficients and pixels).
DEFAULT_MEMORY_BYTES = 1024 * 1024 * 1024
#: The decoder's time cap by default.
DEFAULT_TIMEOUT_SECONDS = 20.0
#: The header of the child's answer: magic, width, height (big-endian).
_HEADER = struct.Struct(">4sII")
_MAGIC = b"MFPX"
#: Exit statuses of the child: the input could not be decoded (its reason on stderr).
EXIT_REFUSED = 3
#: Longest reason the parent repeats from the child's stderr.
_MAX_REASON = 300


def decode_image(
    value: Any,
    field: str = "input.image_base64",
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
) -> Image.Image:
    """The image in ``value`` (standard base64 of a PNG or JPEG file) as RGB, decoded in a child
    process; ``InvalidInput`` if it is not one, or its decoding breaks the memory limit or the cap."""
    from .images import image_bytes

    data = image_bytes(value, field)
    cpu_seconds = int(timeout_seconds) + 2  # a backstop only: the parent's cap answers first
    command = [
        sys.executable,
        "-m",
        "modelforge_runtime_worker.decoder",
        str(int(memory_bytes)),
        str(cpu_seconds),
        field,
    ]
    try:
        done = subprocess.run(  # noqa: S603 - our own interpreter and module, no shell
            command,
            input=data,
            capture_output=True,
            timeout=timeout_seconds,
            check=False,
            env=_child_environment(),
        )
    except subprocess.TimeoutExpired:  # run() has killed it (SIGKILL) and reaped it
        raise invalid_input(
            f"{field} took longer than {timeout_seconds:g} s to decode and was refused"
            " (a hostile or pathological image: for example a progressive JPEG with thousands of scans)"
        ) from None
    if done.returncode == 0:
        return _pixels(done.stdout, field)
    reason = done.stderr.decode("utf-8", "replace").strip()[:_MAX_REASON]
    if done.returncode == EXIT_REFUSED and reason:
        raise invalid_input(reason)
    if done.returncode < 0:
        name = signal_name(-done.returncode)
        raise invalid_input(
            f"{field} could not be decoded within the decoder's limits ({name or 'killed'}: it needs more than"
            f" {memory_bytes // (1024 * 1024)} MiB of memory or too much CPU time)"
        )
    raise invalid_input(
        f"{field} could not be decoded within the decoder's limits (exit {done.returncode}:"
        f" {_last_line(reason) or 'out of memory'})"
    )


def _child_environment() -> dict[str, str]:
    """The decoder needs only to import this package: the interpreter's own paths, nothing else."""
    keep = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "SYSTEMROOT")
    return {name: os.environ[name] for name in keep if name in os.environ}


def _pixels(answer: bytes, field: str) -> Image.Image:
    if len(answer) < _HEADER.size:
        raise invalid_input(f"{field} could not be decoded (the decoder answered nothing)")
    magic, width, height = _HEADER.unpack_from(answer)
    if magic != _MAGIC or len(answer) != _HEADER.size + width * height * 3:
        raise invalid_input(f"{field} could not be decoded (the decoder's answer was malformed)")
    return Image.frombytes("RGB", (width, height), answer[_HEADER.size :])


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:_MAX_REASON] if lines else ""


# --- the child ------------------------------------------------------------------------------


def _limit(memory_bytes: int, cpu_seconds: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))


def main(argv: list[str]) -> int:
    """The child: limit itself, read the file from stdin, write the pixels to stdout."""
    die_with_parent()
    memory_bytes, cpu_seconds, field = int(argv[0]), int(argv[1]), argv[2]
    _limit(memory_bytes, cpu_seconds)
    from .errors import InvalidInput
    from .images import decode_file

    data = sys.stdin.buffer.read()
    try:
        image = decode_file(data, field)
    except InvalidInput as refused:
        sys.stderr.write(refused.message)
        return EXIT_REFUSED
    except MemoryError:
        sys.stderr.write(f"{field} needs more than {memory_bytes // (1024 * 1024)} MiB of memory to decode")
        return EXIT_REFUSED
    out = sys.stdout.buffer
    out.write(_HEADER.pack(_MAGIC, image.width, image.height))
    out.write(image.tobytes())
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
