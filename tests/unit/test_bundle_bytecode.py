"""The bundle's bytecode step on a small zip: a pyc beside each source, stray pycs dropped, the
entries kept as they were, and nothing done for another Python's runtime."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

from modelforge_local_stack import bundle_bytecode

TAG = sys.implementation.cache_tag


FILES = {
    "app.py": b"VALUE = 42\n",
    "lib/__init__.py": b"",
    "lib/mod.py": b"def f():\n    raise ValueError('x')\n",
    "lib/py2only.py": b"print 'python 2'\n",
    "lib/__pycache__/mod.cpython-39.pyc": b"stale",
    "data/model.json": b"{}",
}


def _bundle(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as bundle:
        for name, data in FILES.items():
            bundle.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data)
    return path


def test_each_source_gets_an_unchecked_hash_pyc_and_stray_pycs_go(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "deployment.zip")
    outcome = bundle_bytecode.add(bundle, {bundle_bytecode.this_runtime()})
    assert outcome == bundle_bytecode.Outcome(3, None)
    with zipfile.ZipFile(bundle) as done:
        names = done.namelist()
        assert names[:5] == ["app.py", "lib/__init__.py", "lib/mod.py", "lib/py2only.py", "data/model.json"]
        assert sorted(names[5:]) == sorted(
            [f"__pycache__/app.{TAG}.pyc", f"lib/__pycache__/__init__.{TAG}.pyc", f"lib/__pycache__/mod.{TAG}.pyc"]
        )
        pyc = done.read(f"lib/__pycache__/mod.{TAG}.pyc")
    assert pyc[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(pyc[4:8], "little") == 0b01
    assert pyc[8:16] == importlib.util.source_hash(b"def f():\n    raise ValueError('x')\n")


def test_tracebacks_name_the_file_where_lambda_unpacks_it(tmp_path: Path) -> None:
    import marshal

    bundle = _bundle(tmp_path / "deployment.zip")
    bundle_bytecode.add(bundle, {bundle_bytecode.this_runtime()})
    with zipfile.ZipFile(bundle) as done:
        code = marshal.loads(done.read(f"lib/__pycache__/mod.{TAG}.pyc")[16:])
    assert code.co_filename == "/var/task/lib/mod.py"


def test_another_runtime_keeps_the_bundle_as_it_was_and_says_why(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "deployment.zip")
    before = bundle.read_bytes()
    outcome = bundle_bytecode.add(bundle, {"python3.9"})
    assert outcome.compiled == 0
    assert (
        outcome.skipped is not None
        and "python3.9" in outcome.skipped
        and bundle_bytecode.this_runtime() in outcome.skipped
    )
    assert bundle.read_bytes() == before


def test_the_same_bundle_gives_the_same_bytes(tmp_path: Path) -> None:
    first, second = _bundle(tmp_path / "a.zip"), _bundle(tmp_path / "b.zip")
    bundle_bytecode.add(first, {bundle_bytecode.this_runtime()})
    bundle_bytecode.add(second, {bundle_bytecode.this_runtime()})
    assert first.read_bytes() == second.read_bytes()
