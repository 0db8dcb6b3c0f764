"""No product file over 600 lines: a module has one job, and one job fits in 600 lines. Product
code is every Python file of the deployables and their shared bottom layer (functions/, agent/,
worker/, protocol/, tools/); tests, benchmarks and scripts are not held to it. Data that is not
code (an OpenAPI document, say) may live in a file of its own that is not Python."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ("functions", "agent", "worker", "protocol", "tools")
MAX_LINES = 600
#: Folders that hold no code of the project's own (environments, build output, caches).
SKIPPED_DIRS = {"node_modules", "vendor", "build", "dist", "__pycache__"}


def product_files(root: Path = ROOT) -> Iterator[Path]:
    """Every Python file under the product folders (skipping hidden folders such as .venv)."""
    for folder in PRODUCT_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).parts[:-1]
            if not any(part.startswith(".") or part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts):
                yield path


def oversized(root: Path = ROOT, max_lines: int = MAX_LINES) -> list[str]:
    """``path: N lines`` for each product file over ``max_lines`` lines, largest first."""
    counts = [(len(path.read_text(encoding="utf-8").splitlines()), path) for path in product_files(root)]
    return [
        f"{path.relative_to(root)}: {lines} lines" for lines, path in sorted(counts, reverse=True) if lines > max_lines
    ]


def test_product_files_each_at_most_600_lines() -> None:
    assert oversized() == [], f"split these into modules of one job each (at most {MAX_LINES} lines)"


def test_product_files_found_in_every_product_folder() -> None:
    found = {path.relative_to(ROOT).parts[0] for path in product_files()}
    assert found == set(PRODUCT_DIRS)


def test_oversized_file_over_the_cap_named_with_its_length(tmp_path: Path) -> None:
    (tmp_path / "worker" / "pkg").mkdir(parents=True)
    (tmp_path / "worker" / "pkg" / "big.py").write_text("x = 1\n" * 4)
    (tmp_path / "worker" / "pkg" / "small.py").write_text("x = 1\n" * 3)
    (tmp_path / "tools" / ".venv").mkdir(parents=True)
    (tmp_path / "tools" / ".venv" / "site.py").write_text("x = 1\n" * 9)  # not the project's own
    assert oversized(tmp_path, max_lines=3) == ["worker/pkg/big.py: 4 lines"]
