"""The runtime worker as a real process, and the images its tests send it."""

from __future__ import annotations

import base64
import difflib
import io
import random
import re
import signal
import sys
from pathlib import Path

from modelforge_runtime_worker.client import WorkerClient

from tests.support.processes import LoggedProcess, run_to_exit

WORKER_COMMAND = [sys.executable, "-m", "modelforge_runtime_worker.main"]
LISTENING_RE = re.compile(r"worker listening on (\S+), capabilities: ([^\"]*)\"")


def worker_env(root: Path, **extra: str) -> dict[str, str]:
    """A worker on ``root/worker.sock`` with its artifact and quarantine roots under ``root``."""
    return {
        "MODELFORGE_WORKER_LISTEN": f"unix://{root / 'worker.sock'}",
        "MODELFORGE_WORKER_ARTIFACT_ROOT": str(root / "artifacts"),
        "MODELFORGE_WORKER_QUARANTINE_ROOT": str(root / "quarantine"),
        "MODELFORGE_WORKER_DEVICE": "cpu",
        **extra,
    }


class Worker(LoggedProcess):
    """A started worker that has logged its listening line: its address and a client for it."""

    address: str
    capabilities: str

    def client(self, timeout: float = 60, *, keep_alive: bool = False) -> WorkerClient:
        return WorkerClient(self.address, timeout, keep_alive=keep_alive)


def start_worker(log_path: Path, env: dict[str, str], timeout: float = 60) -> Worker:
    """Start the worker and wait for ``worker listening on ...`` (killed if it never comes)."""
    worker = Worker(WORKER_COMMAND, log_path, env)
    try:
        match = worker.wait_for(LISTENING_RE, timeout)
    except BaseException:
        worker.stop(signal.SIGKILL)
        raise
    worker.address, worker.capabilities = match.group(1), match.group(2)
    return worker


def run_worker_to_exit(env: dict[str, str], timeout: float = 60):  # type: ignore[no-untyped-def]
    return run_to_exit(WORKER_COMMAND, env, timeout=timeout)


def text_png(lines: list[str], size: tuple[int, int] | None = None, font_size: int = 48) -> bytes:
    """Black text on white, one line under the other, as a PNG file."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=font_size)
    step = int(font_size * 1.6)
    width, height = size or (max(40 + int(font_size * 0.7 * len(line)) for line in lines), 40 + step * len(lines))
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for number, line in enumerate(lines):
        draw.text((20, 20 + number * step), line, fill="black", font=font)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


#: A TrueType font every test machine has (Debian's fonts-dejavu-core: scripts/_system_packages.sh).
PAGE_FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
_PAGE_WORDS = (
    "invoice total amount due date payment received account number reference order shipped customer "
    "address street city postal code quantity price tax subtotal balance credit note delivery warehouse "
    "item description unit weight volume contract period terms conditions"
)


def page_lines(count: int = 40, seed: int = 21) -> list[str]:
    """``count`` lines of a business document: numbered, 6-9 words, an amount; the same every run."""
    rng, vocabulary = random.Random(seed), _PAGE_WORDS.split()
    lines = []
    for number in range(1, count + 1):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(6, 9))]
        amount = f"{rng.randint(10, 9999)}.{rng.randint(0, 99):02d}"
        lines.append(f"{number:02d}. {words[0].capitalize()} {' '.join(words[1:])} {amount}")
    return lines


def page_png(lines: list[str], size: tuple[int, int]) -> bytes:
    """A printed page: ``lines`` in DejaVu Sans, black on white, spread over the page's height
    (a 2000x2800 page of 40 lines has 31 px letters; at 1000x1400, 15 px)."""
    from PIL import Image, ImageDraw, ImageFont

    assert PAGE_FONT.is_file(), f"{PAGE_FONT} is missing: install fonts-dejavu-core (scripts/_system_packages.sh)"
    width, height = size
    font = ImageFont.truetype(str(PAGE_FONT), int(height / len(lines) * 0.55))
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    top, step = int(height * 0.03), height * 0.94 / len(lines)
    for number, line in enumerate(lines):
        draw.text((int(width * 0.06), top + number * step), line, fill="black", font=font)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def character_accuracy(read: str, truth: str) -> float:
    """1 - edit distance / len(truth). The distance is Levenshtein's on each stretch between the
    blocks the two texts share (difflib), which is never less than the true distance: the
    accuracy is never overstated, and a page costs milliseconds, not seconds."""
    blocks = difflib.SequenceMatcher(None, truth, read, autojunk=False).get_opcodes()
    distance = sum(_levenshtein(truth[i1:i2], read[j1:j2]) for tag, i1, i2, j1, j2 in blocks if tag != "equal")
    return 1 - distance / len(truth)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def squash(text: str) -> str:
    """Case and spacing removed: what OCR is compared on."""
    return re.sub(r"\s+", "", text).upper()


def children_running(parent: int, module: str) -> list[int]:
    """The pids of ``parent``'s live children whose command line names ``module`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z" and module.encode() in command:
            found.append(int(entry.name))
    return sorted(found)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
