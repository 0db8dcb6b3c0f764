"""Compiled bytecode in the Lambda bundle, so that a cold start does not compile the app.

Lambda's code folder (``/var/task``) is read-only, and ``chalice package`` ships sources only (and
whatever stray ``__pycache__`` a developer's tree held, with timestamps that never match). So every
cold start compiled app.py, chalicelib and every bundled library (botocore included) from source.
This step compiles each ``.py`` of ``deployment.zip`` with ``compileall`` into
``__pycache__/<name>.cpython-XY.pyc`` beside it, as unchecked-hash pycs (PEP 552): valid without the
file times a zip does not keep, and right for a bundle whose sources never change after the build.

The bytecode is only valid for the Python that made it, so the step runs only when this Python's
``major.minor`` is the functions' runtime (Chalice takes the runtime from the Python that packages,
so they match unless a template was edited). Otherwise the bundle keeps its sources and the caller
says why.
"""

from __future__ import annotations

import compileall
import os
import py_compile
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

#: Where Lambda unpacks a function's code: the file names its tracebacks show.
LAMBDA_TASK_ROOT = "/var/task"
#: Fixed entry time and mode for the files this step adds, so a bundle builds byte-for-byte alike.
_ENTRY_TIME = (1980, 1, 1, 0, 0, 0)
_ENTRY_MODE = 0o100644 << 16


@dataclass(frozen=True)
class Outcome:
    compiled: int  # pycs added
    skipped: str | None  # why none were, or None


def this_runtime() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def add(bundle: Path, runtimes: set[str]) -> Outcome:
    """Rewrite ``bundle`` (a zip) with a pyc beside each of its sources, if ``runtimes`` is this Python."""
    if runtimes != {this_runtime()}:
        wanted = ", ".join(sorted(runtimes)) or "none"
        return Outcome(0, f"the functions run {wanted} and this is {this_runtime()}; sources only")
    with tempfile.TemporaryDirectory(dir=bundle.parent) as scratch:
        tree = Path(scratch) / "tree"
        with zipfile.ZipFile(bundle) as original:
            kept = [info for info in original.infolist() if not _is_bytecode(info.filename)]
            original.extractall(tree, members=[info.filename for info in kept])
            compileall.compile_dir(
                tree,
                quiet=2,  # a source this Python cannot compile (a vendored Python 2 file) keeps no pyc
                stripdir=str(tree),
                prependdir=LAMBDA_TASK_ROOT,
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                workers=1,
            )
            rebuilt = Path(scratch) / bundle.name
            with zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as out:
                for info in kept:
                    out.writestr(info, original.read(info))
                pycs = sorted(path for path in tree.rglob("*.pyc") if path.parent.name == "__pycache__")
                for path in pycs:
                    entry = zipfile.ZipInfo(path.relative_to(tree).as_posix(), _ENTRY_TIME)
                    entry.external_attr = _ENTRY_MODE
                    entry.compress_type = zipfile.ZIP_DEFLATED
                    out.writestr(entry, path.read_bytes())
        os.replace(rebuilt, bundle)
    return Outcome(len(pycs), None)


def _is_bytecode(name: str) -> bool:
    return name.endswith((".pyc", ".pyo")) or "/__pycache__/" in f"/{name}"
