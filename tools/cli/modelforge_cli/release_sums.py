"""``SHA256SUMS``: the bundle folder's checksum file, in the format ``sha256sum`` writes and
``sha256sum -c`` checks (``<64 hex>  <file name>``, one line per file)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path

SUMS_FILE = "SHA256SUMS"
_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sums_text(sums: Mapping[str, str]) -> str:
    """``SHA256SUMS`` for ``{file name: hex digest}``, sorted by name."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items()))


def parse_sums(text: str) -> tuple[dict[str, str], list[str]]:
    """``({file name: hex digest}, problems)``: a file name must be a plain name in the folder."""
    sums: dict[str, str] = {}
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _LINE.fullmatch(line)
        if match is None:
            problems.append(f"{SUMS_FILE} line {number}: not '<sha256>  <file>'")
            continue
        digest, name = match.group(1).lower(), match.group(2)
        if "/" in name or "\\" in name or name in (".", ".."):
            problems.append(f"{SUMS_FILE} line {number}: {name[:80]!r} is not a file of this folder")
        elif name in sums:
            problems.append(f"{SUMS_FILE} line {number}: {name} is listed twice")
        else:
            sums[name] = digest
    if not sums and not problems:
        problems.append(f"{SUMS_FILE} lists no file")
    return sums, problems


def check_sums(folder: Path, sums: Mapping[str, str]) -> list[str]:
    """Every listed file that is missing or whose SHA-256 differs, one line each."""
    problems = []
    for name, expected in sorted(sums.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{SUMS_FILE}: {name} is missing")
            continue
        found = file_sha256(path)
        if found != expected:
            problems.append(f"{SUMS_FILE}: {name}: checksum mismatch: expected {expected}, found {found}")
    return problems
