"""The docs stay readable to the end and inside the repository: the README at most 250 lines,
docs/ARCHITECTURE.md at most 350 (new design material gets its own file under docs/), every doc
under docs/ reachable from the README, and no doc that links or points outside the repository."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
README_MAX_LINES = 250
ARCHITECTURE_MAX_LINES = 350
#: Folders that hold no doc of the project's own (environments, build output, caches, state).
SKIPPED_DIRS = {"node_modules", "vendor", "build", "dist", "__pycache__", "test-artifacts"}

#: A Markdown link or image: [text](target) or ![alt](target).
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
#: A path that climbs out of the folder it is read from.
_PARENT = re.compile(r"(?<![\w.])\.\./")
#: An absolute path on a machine that wrote the docs, not in the repository.
_ABSOLUTE = re.compile(r"(?<![\w.:/])/(?:work|home|Users)/")


def docs() -> Iterator[Path]:
    """Every Markdown file of the project (skipping hidden folders such as .git and .venv)."""
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts[:-1]
        if not any(part.startswith(".") or part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts):
            yield path


def _anchors(path: Path) -> set[str]:
    """The fragment of each heading, as GitHub makes it: lower case, punctuation dropped, - for spaces."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)
    }


def link_problems(path: Path, text: str | None = None) -> list[str]:
    """What in one doc (its text, else the file's) points outside the repository, or to nothing in it."""
    text = path.read_text() if text is None else text
    where = path.relative_to(ROOT)
    problems = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: another site, not a file
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{where}: link {target} leaves the repository")
        elif not resolved.exists():
            problems.append(f"{where}: link {target} names nothing in the repository")
        elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            problems.append(f"{where}: link {target} names no heading of {resolved.relative_to(ROOT)}")
    prose = _LINK.sub("", text)
    for line_number, line in enumerate(prose.splitlines(), 1):
        if _PARENT.search(line):
            problems.append(f"{where}:{line_number}: a ../ path outside a link (cite paths from the repository root)")
        if _ABSOLUTE.search(line):
            problems.append(f"{where}:{line_number}: an absolute path outside the repository")
    return problems


def test_readme_is_at_most_250_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move reference material to docs/"


def test_architecture_is_at_most_350_lines() -> None:
    lines = len(ARCHITECTURE.read_text().splitlines())
    assert lines <= ARCHITECTURE_MAX_LINES, (
        f"docs/ARCHITECTURE.md has {lines} lines: give new design material its own file under docs/, linked from it"
    )


def test_docs_found_include_the_readme_and_every_doc_folder() -> None:
    found = {path.relative_to(ROOT).as_posix() for path in docs()}
    assert {"README.md", "docs/ARCHITECTURE.md", "agent/README.md", "worker/README.md"} <= found


def test_every_doc_links_only_inside_the_repository() -> None:
    problems = [problem for path in docs() for problem in link_problems(path)]
    assert not problems, "\n".join(problems)


def test_every_doc_under_docs_is_linked_from_the_readme() -> None:
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in _LINK.findall(README.read_text())}
    missing = [path.name for path in sorted((ROOT / "docs").glob("*.md")) if path.resolve() not in linked]
    assert not missing, f"docs the README's 'Where to go next' does not link: {missing}"


def test_readme_names_no_test_count() -> None:
    assert not re.search(r"\b\d[\d,]*\s+(tests|passed)\b", README.read_text())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see [the design](../../outside/DESIGN.md)", "leaves the repository"),
        ("see `../shared/DESIGN.md`", "a ../ path outside a link"),
        ("kept in /work/shared/DESIGN.md", "an absolute path outside the repository"),
        ("see [nothing](NO_SUCH_FILE.md)", "names nothing in the repository"),
        ("see [a section](ARCHITECTURE.md#no-such-heading)", "names no heading"),
    ],
)
def test_link_problems_for_a_path_outside_the_repository_are_reported(text: str, expected: str) -> None:
    problems = link_problems(ROOT / "docs" / "PROBE.md", text + "\n")
    assert len(problems) == 1 and expected in problems[0], problems


def test_link_problems_for_links_inside_the_repository_are_none() -> None:
    assert link_problems(ROOT / "docs" / "ARCHITECTURE.md") == []
    assert link_problems(README) == []
