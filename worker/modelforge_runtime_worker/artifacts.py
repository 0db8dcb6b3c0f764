"""The artifact root: the model files the worker runs, pinned by ``manifest.json``, and the
quarantine root, where a file that does not match goes.

On every start, before anything is loaded (``prepare``):

- first start (no manifest, no model file): the three ONNX models bundled in the rapidocr wheel
  are copied in, each checked against the digest this release pins (``BUNDLED``), and
  ``manifest.json`` records each file's SHA-256 and size;
- every later start: each file the manifest names is checked (size, then SHA-256). A file that
  differs, is missing, or is not a regular file is moved to the quarantine root with a note
  ``<name>.quarantine.json`` (expected and found SHA-256, when, why); the OCR capability is then
  unavailable (``artifact_quarantined``) and the file is never loaded. Nothing is repaired
  automatically: a quarantined or missing file stays so until an operator acts (README.md);
- no manifest but model files present: adopted as a first start only when they match the
  bundled models; any that does not is quarantined, and the manifest is written with the bundled
  digests, so a quarantined file stays missing on the next start;
- a manifest that cannot be read, or that names other models than this release serves (another
  release's, or rewritten), is itself quarantined and the start proceeds as without one.

Before that, each root must be a directory that neither group nor others can write (else the start
stops: anyone who can write there could swap a model), and nothing in the artifact root is ever
opened through a symbolic link (``O_NOFOLLOW``; new files are created ``O_EXCL``).

After it, the models are loaded from the bytes that were hashed (``read_models``): each file is
read once, checked against the manifest, and those bytes are what onnxruntime gets, so a file
swapped between the check and the load (and back) cannot run. rapidocr's own download path is never
used, and any download attempt is refused (``ocr.py``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.util import find_spec
from pathlib import Path
from typing import Any, BinaryIO

from modelforge_protocol import files

log = logging.getLogger("modelforge.worker.artifacts")

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
LOCK_NAME = ".lock"
NOTE_SUFFIX = ".quarantine.json"
CHUNK = 1 << 20
#: Mode bits that let someone other than the owner write into a root.
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC
#: The rapidocr release whose wheel supplies the models (pinned exactly in worker/pyproject.toml).
RAPIDOCR_VERSION = "3.10.0"

QUARANTINED = "artifact_quarantined"
BUNDLE_UNAVAILABLE = "bundled_models_unavailable"


@dataclass(frozen=True)
class ModelFile:
    role: str  # det, cls or rec: which stage of the OCR pipeline loads it
    name: str
    sha256: str
    size: int

    def entry(self) -> dict[str, Any]:
        return {"role": self.role, "name": self.name, "sha256": self.sha256, "size": self.size}


#: The models this release runs: the ones the rapidocr 3.10.0 wheel bundles under rapidocr/models/
#: (the same digests as its default_models.yaml). The rec model carries its character set in its
#: ONNX metadata, so no dictionary file is needed.
BUNDLED: tuple[ModelFile, ...] = (
    ModelFile(
        "det", "PP-OCRv6_det_small.onnx", "090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f", 9929594
    ),
    ModelFile(
        "cls",
        "ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        585532,
    ),
    ModelFile(
        "rec", "PP-OCRv6_rec_small.onnx", "6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884", 21234383
    ),
)


class StorageUnusable(Exception):
    """The artifact or quarantine root cannot be created, read or written; the worker exits 4."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Quarantine:
    """One file that did not match: where it went (``moved_to`` None when it was missing) and the note."""

    name: str
    reason: str
    expected_sha256: str | None
    found_sha256: str | None
    moved_to: Path | None
    note: Path | None


@dataclass
class ArtifactState:
    root: Path
    models: tuple[ModelFile, ...]
    #: role -> path of each verified file (all of ``models`` when ``reason`` is None)
    paths: dict[str, Path] = field(default_factory=dict)
    quarantined: list[Quarantine] = field(default_factory=list)
    #: the manifest, when it was quarantined on this start
    manifest_quarantine: Quarantine | None = None
    #: why the models cannot be used, or None
    reason: str | None = None
    populated: bool = False

    @property
    def usable(self) -> bool:
        return self.reason is None

    @property
    def model_sha256(self) -> str:
        return models_digest(self.models)


def models_digest(models: Iterable[ModelFile]) -> str:
    """The OCR capability's ``model_sha256``: SHA-256 of the manifest's files in ``sha256sum``
    format (``<sha256>  <name>\\n``), sorted by name (byte order), i.e. what
    ``cd ARTIFACT_ROOT && LC_ALL=C sha256sum *.onnx | sha256sum`` prints."""
    lines = "".join(f"{model.sha256}  {model.name}\n" for model in sorted(models, key=lambda m: m.name.encode()))
    return hashlib.sha256(lines.encode()).hexdigest()


def bundled_models_dir() -> Path | None:
    """Where the installed rapidocr wheel keeps its models (found without importing rapidocr)."""
    spec = find_spec("rapidocr")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _open_regular(path: Path) -> BinaryIO | None:
    """``path`` opened for reading when it is a regular file; None when it is absent or not a
    regular file (a symbolic link is never followed, a FIFO never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NO_LINK)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            return None
        raise
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        return None
    return handle


def file_digest(path: Path) -> tuple[str, int] | None:
    """SHA-256 and size of a regular file; None when it is absent or not a regular file (a
    symbolic link is never followed)."""
    handle = _open_regular(path)
    if handle is None:
        return None
    with handle:
        digest, size = hashlib.sha256(), 0
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _judge(path: Path, model: ModelFile, found: tuple[str, int] | None) -> tuple[str | None, str | None]:
    """(None, sha256) when ``found`` (the SHA-256 and size read from ``path``) is ``model``; else
    (why not, the SHA-256 found or None)."""
    if found is None:
        try:
            something_else = not stat.S_ISREG(path.lstat().st_mode)  # a link, a folder, a FIFO...
        except FileNotFoundError:
            something_else = False
        return ("not_a_regular_file" if something_else else "missing"), None
    if found[1] != model.size:
        return "size_mismatch", found[0]
    if found[0] != model.sha256:
        return "sha256_mismatch", found[0]
    return None, found[0]


def _check(path: Path, model: ModelFile) -> tuple[str | None, str | None]:
    """(None, sha256) when ``path`` is ``model``; else (why not, the SHA-256 found or None)."""
    return _judge(path, model, file_digest(path))


def _read_checked(path: Path, model: ModelFile) -> tuple[str | None, str | None, bytes]:
    """``path``'s bytes, read once, and ``_judge``'s verdict on exactly those bytes."""
    handle = _open_regular(path)
    if handle is None:
        return (*_judge(path, model, None), b"")
    with handle:
        data = handle.read(model.size + 1)  # one byte more than the model tells a longer file apart
        digest, size = hashlib.sha256(data), len(data)
        while size > model.size and (chunk := handle.read(CHUNK)):  # too long: hashed for the note, not kept
            digest.update(chunk)
            size += len(chunk)
    return (*_judge(path, model, (digest.hexdigest(), size)), data)


def _check_root(folder: Path, what: str) -> None:
    """Refuse a root that is not a directory, or that group or others can write to."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    if mode & _WRITABLE_BY_OTHERS:
        raise StorageUnusable(
            f"{what} {folder} has mode {mode:04o}: it is writable by group or others, so anyone who can "
            f"write there could replace the models the worker runs. The worker refuses to use it. Run "
            f"`chmod go-w {folder}` (the worker creates its roots 0755 and 0750)"
        )


class Artifacts:
    """Prepares the artifact root for one start. ``models``: what this release runs;
    ``bundle_dir``: where to copy them from on a first start."""

    def __init__(
        self,
        root: Path,
        quarantine_root: Path,
        *,
        models: tuple[ModelFile, ...] = BUNDLED,
        bundle_dir: Path | None = None,
        clock: Callable[[], str] = _now,
    ) -> None:
        self.root = root
        self.quarantine_root = quarantine_root
        self.models = models
        self.bundle_dir = bundle_dir
        self.clock = clock

    # --- the whole start-up check ------------------------------------------------------------

    def prepare(self) -> ArtifactState:
        try:
            self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
            self.quarantine_root.mkdir(mode=0o750, parents=True, exist_ok=True)
            _check_root(self.root, "artifact root")
            _check_root(self.quarantine_root, "quarantine root")
            lock = self._open_lock()
            try:  # one worker prepares a root at a time
                fcntl.flock(lock, fcntl.LOCK_EX)
                return self._prepare()
            finally:
                os.close(lock)
        except OSError as error:
            where = error.filename or self.root
            raise StorageUnusable(f"artifact storage unusable: {where}: {error.strerror or error}") from error

    def _open_lock(self) -> int:
        """The lock file's descriptor: created 0600 if absent, never through a link, never a non-file."""
        path = self.root / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NO_LINK, 0o600)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise StorageUnusable(
                    f"artifact storage unusable: {path} is a symbolic link; the worker does not follow it. "
                    "Remove the link (the worker creates the lock file itself)"
                ) from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StorageUnusable(f"artifact storage unusable: {path} is not a regular file; remove it")
        return fd

    def _prepare(self) -> ArtifactState:
        state = ArtifactState(root=self.root, models=self.models)
        manifest = self._read_manifest(state)
        if manifest is None:
            self._adopt_or_populate(state)
        else:
            for model in self.models:
                self._verify_one(state, model)
        incomplete = state.reason is None and set(state.paths) != {model.role for model in self.models}
        if state.quarantined or incomplete:
            state.reason = QUARANTINED
        if state.reason is not None:
            state.paths = {}
        return state

    def read_models(self, state: ArtifactState) -> dict[str, bytes] | None:
        """role -> the bytes of each verified model, each file read once and judged on exactly
        those bytes: what the caller loads is what was checked. A file that no longer matches (it
        changed since ``prepare``) is quarantined and the state made unusable (None)."""
        blobs: dict[str, bytes] = {}
        for model in self.models:
            problem, found, data = _read_checked(self.root / model.name, model)
            if problem is None:
                blobs[model.role] = data
            elif not any(entry.name == model.name for entry in state.quarantined):
                state.quarantined.append(self._quarantine(model.name, problem, model.sha256, found))
        if state.quarantined or set(blobs) != {model.role for model in self.models}:
            state.reason, state.paths = QUARANTINED, {}
            return None
        return blobs

    # --- the manifest ---------------------------------------------------------------------------

    def _read_manifest(self, state: ArtifactState) -> dict[str, Any] | None:
        path = self.root / MANIFEST_NAME
        if not path.exists() and not path.is_symlink():
            return None
        problem = None
        manifest: Any = None
        handle = _open_regular(path)
        if handle is None:
            problem = "manifest_not_a_regular_file"
        else:
            try:
                with handle:
                    manifest = json.loads(handle.read())
            except (ValueError, UnicodeDecodeError):
                problem = "manifest_unreadable"
        if problem is None:
            entries = _manifest_models(manifest)
            if entries is None:
                problem = "manifest_unreadable"
            elif sorted(entries, key=lambda m: m.role) != sorted(self.models, key=lambda m: m.role):
                problem = "manifest_names_other_models"
        if problem is None:
            return manifest
        found = file_digest(path)
        # the manifest's own quarantine does not make the models unusable: they are judged next
        state.manifest_quarantine = self._quarantine(MANIFEST_NAME, problem, None, found[0] if found else None)
        return None

    def _write_manifest(self) -> None:
        body = {
            "format": MANIFEST_FORMAT,
            "written_at": self.clock(),
            "source": f"rapidocr {RAPIDOCR_VERSION} wheel (rapidocr/models/)",
            "files": [model.entry() for model in self.models],
        }
        files.atomic_write(self.root / MANIFEST_NAME, (json.dumps(body, indent=2) + "\n").encode(), mode=0o644)

    # --- the files ------------------------------------------------------------------------------

    def _verify_one(self, state: ArtifactState, model: ModelFile) -> None:
        path = self.root / model.name
        problem, found = _check(path, model)
        if problem is None:
            state.paths[model.role] = path
            return
        state.paths.pop(model.role, None)
        if any(entry.name == model.name for entry in state.quarantined):
            return
        state.quarantined.append(self._quarantine(model.name, problem, model.sha256, found))

    def _adopt_or_populate(self, state: ArtifactState) -> None:
        """No (usable) manifest: files already there must be the bundled ones; missing ones are
        copied from the wheel; then the manifest is written, whatever was quarantined."""
        for model in self.models:
            path = self.root / model.name
            if path.exists() or path.is_symlink():
                self._verify_one(state, model)
                continue
            if self._copy_from_bundle(model, path):
                state.paths[model.role] = path
                state.populated = True
            else:
                state.reason = BUNDLE_UNAVAILABLE
        if state.reason is None or state.quarantined:
            self._write_manifest()
        if state.populated:
            log.info(
                "artifact root populated from the rapidocr wheel",
                extra={"event": "artifacts_populated", "artifact_root": str(self.root)},
            )

    def _copy_from_bundle(self, model: ModelFile, target: Path) -> bool:
        source = self.bundle_dir / model.name if self.bundle_dir is not None else None
        found = file_digest(source) if source is not None else None
        if source is None or found is None or found != (model.sha256, model.size):
            log.error(
                "the installed rapidocr wheel does not hold this release's model; reinstall the worker",
                extra={
                    "event": "bundled_model_unavailable",
                    "file": model.name,
                    "bundle_dir": str(self.bundle_dir),
                    "expected_sha256": model.sha256,
                    "found_sha256": found[0] if found else None,
                },
            )
            return False
        digest = hashlib.sha256()
        try:
            with open(source, "rb") as reader, files.atomic_file(target, mode=0o444) as writer:
                while chunk := reader.read(CHUNK):
                    digest.update(chunk)
                    writer.write(chunk)
                if digest.hexdigest() != model.sha256:  # changed while it was copied: keep nothing
                    raise _ChangedWhileCopied
        except _ChangedWhileCopied:
            return False
        return True

    # --- quarantine -----------------------------------------------------------------------------

    def _quarantine(self, name: str, reason: str, expected: str | None, found: str | None) -> Quarantine:
        """Move ``name`` (when present) out of the artifact root, with a note saying why."""
        source = self.root / name
        moved_to: Path | None = None
        if source.exists() or source.is_symlink():
            moved_to = _free_name(self.quarantine_root, name)
            try:
                os.rename(source, moved_to)
            except OSError as error:
                if error.errno != errno.EXDEV:
                    raise
                shutil.move(str(source), str(moved_to))  # another file system: copy, then delete
            _make_read_only(moved_to)
            note: Path | None = moved_to.with_name(moved_to.name + NOTE_SUFFIX)
        else:
            # missing: one note says why; an earlier note (e.g. from its quarantine) is kept as it is
            note = self.quarantine_root / (name + NOTE_SUFFIX)
            if note.exists():
                note = None
        if note is not None:
            body = {
                "name": name,
                "reason": reason,
                "expected_sha256": expected,
                "found_sha256": found,
                "quarantined_at": self.clock(),
                "artifact_root": str(self.root),
                "moved_to": str(moved_to) if moved_to is not None else None,
            }
            files.atomic_write(note, (json.dumps(body, indent=2) + "\n").encode(), mode=0o640)
        log.error(
            f"artifact {name} quarantined ({reason})",
            extra={
                "event": "artifact_quarantined",
                "file": name,
                "reason": reason,
                "expected_sha256": expected,
                "found_sha256": found,
                "moved_to": str(moved_to) if moved_to else None,
                "note": str(note) if note else None,
            },
        )
        return Quarantine(name, reason, expected, found, moved_to, note)


def _manifest_models(manifest: Any) -> list[ModelFile] | None:
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None
    files = manifest.get("files")
    if not isinstance(files, list):
        return None
    models = []
    for entry in files:
        if not isinstance(entry, dict):
            return None
        role, name, sha256, size = (entry.get(key) for key in ("role", "name", "sha256", "size"))
        if not (isinstance(role, str) and isinstance(name, str) and isinstance(sha256, str)):
            return None
        if isinstance(size, bool) or not isinstance(size, int) or "/" in name or name in ("", ".", ".."):
            return None
        models.append(ModelFile(role, name, sha256, size))
    return models


def _make_read_only(path: Path) -> None:
    """chmod 0440 a quarantined regular file, through a descriptor: never a link's target."""
    handle = _open_regular(path)
    if handle is not None:
        with handle:
            os.fchmod(handle.fileno(), 0o440)


def _free_name(folder: Path, name: str) -> Path:
    """``folder/name``, or ``name.1``, ``name.2``... when an earlier quarantine took it."""
    candidate, count = folder / name, 0
    while candidate.exists() or candidate.is_symlink() or candidate.with_name(candidate.name + NOTE_SUFFIX).exists():
        count += 1
        candidate = folder / f"{name}.{count}"
    return candidate


class _ChangedWhileCopied(Exception):
    """The bundled model's bytes differ from its digest: the copy is abandoned."""
