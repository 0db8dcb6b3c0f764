"""No shipped or bench code edits ``sys.path``: every package is a distribution that scripts/_venv.sh
installs (the control plane, the CLI, the local stack, the benches' shared code), so an import
finds it the way it finds any package."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the shipped code, the benches and the scripts; tests may build throwaway interpreters
CHECKED = ("agent", "worker", "functions", "tools", "protocol", "bench", "scripts", "localstack")
SKIPPED = ("build", "vendor", "node_modules")
_PATH_EDIT = re.compile(r"\bsys\.path\s*(?:\.(?:insert|append|extend)\s*\(|\+?=)|\bsite\.addsitedir\s*\(")


def _python_files(top: Path) -> Iterator[Path]:
    for folder, subfolders, files in os.walk(top):
        # build output and functions/vendor (copies made at install and packaging) are not sources
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in SKIPPED]
        yield from (Path(folder, name) for name in files if name.endswith(".py"))


def test_no_path_edit_in_shipped_or_bench_code() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for top in CHECKED
        for path in _python_files(ROOT / top)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _PATH_EDIT.search(line)
    ]
    assert found == []


def test_path_edit_pattern_finds_each_way_of_editing_the_path() -> None:
    for line in ("sys.path.insert(0, x)", "sys.path.append(x)", "sys.path += [x]", "site.addsitedir(x)"):
        assert _PATH_EDIT.search(line), line
    assert not _PATH_EDIT.search("print(sys.path)")
