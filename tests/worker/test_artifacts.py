"""The artifact root and quarantine decisions, on small stand-in model files (the real models are
exercised by the process tests): what is copied, verified, quarantined, and what stays so; and the
root against someone who can plant files or links in it: a root group or others can write is
refused, and no file in it (the lock, the first start's temporary files, the manifest, a
quarantined file) is ever opened or chmod-ed through a symbolic link."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from modelforge_protocol import files
from modelforge_runtime_worker.artifacts import (
    BUNDLED,
    MANIFEST_NAME,
    QUARANTINED,
    Artifacts,
    ArtifactState,
    ModelFile,
    StorageUnusable,
    bundled_models_dir,
    file_digest,
    models_digest,
)

CONTENT = {"det": b"detector weights" * 100, "cls": b"classifier" * 10, "rec": b"recogniser weights" * 300}
NAMES = {"det": "det.onnx", "cls": "cls.onnx", "rec": "rec.onnx"}
MODELS = tuple(
    ModelFile(role, NAMES[role], hashlib.sha256(CONTENT[role]).hexdigest(), len(CONTENT[role]))
    for role in ("det", "cls", "rec")
)
CLOCK = "2026-01-02T03:04:05+00:00"


@pytest.fixture()
def bundle(tmp_path: Path) -> Path:
    folder = tmp_path / "wheel" / "models"
    folder.mkdir(parents=True)
    for role, data in CONTENT.items():
        (folder / NAMES[role]).write_bytes(data)
    return folder


@pytest.fixture()
def roots(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "var" / "artifacts", tmp_path / "var" / "quarantine"


def prepare(roots: tuple[Path, Path], bundle: Path | None) -> ArtifactState:
    artifacts, quarantine = roots
    return Artifacts(artifacts, quarantine, models=MODELS, bundle_dir=bundle, clock=lambda: CLOCK).prepare()


def note(roots: tuple[Path, Path], name: str) -> dict:
    return json.loads((roots[1] / f"{name}.quarantine.json").read_text())


def test_first_start_copies_the_bundled_models_and_writes_the_manifest(roots, bundle) -> None:
    state = prepare(roots, bundle)
    assert state.usable and state.populated and state.quarantined == []
    assert state.paths == {role: roots[0] / NAMES[role] for role in NAMES}
    for role, data in CONTENT.items():
        assert (roots[0] / NAMES[role]).read_bytes() == data
        assert (roots[0] / NAMES[role]).stat().st_mode & 0o777 == 0o444
    manifest = json.loads((roots[0] / MANIFEST_NAME).read_text())
    assert manifest["format"] == 1 and manifest["written_at"] == CLOCK
    assert manifest["files"] == [model.entry() for model in MODELS]
    assert list(roots[1].iterdir()) == []


def test_a_later_start_verifies_and_copies_nothing(roots, bundle) -> None:
    prepare(roots, bundle)
    manifest = (roots[0] / MANIFEST_NAME).read_bytes()
    state = prepare(roots, None)  # no bundle needed once populated
    assert state.usable and not state.populated
    assert (roots[0] / MANIFEST_NAME).read_bytes() == manifest


def test_a_tampered_file_is_quarantined_with_a_note_and_stays_out(roots, bundle) -> None:
    prepare(roots, bundle)
    rec = roots[0] / "rec.onnx"
    os.chmod(rec, 0o644)
    tampered = bytearray(CONTENT["rec"])
    tampered[10] ^= 0xFF  # same size, other content
    rec.write_bytes(bytes(tampered))
    state = prepare(roots, bundle)
    assert not state.usable and state.reason == QUARANTINED and state.paths == {}
    assert not rec.exists()
    assert (roots[1] / "rec.onnx").read_bytes() == bytes(tampered)
    assert note(roots, "rec.onnx") == {
        "name": "rec.onnx",
        "reason": "sha256_mismatch",
        "expected_sha256": MODELS[2].sha256,
        "found_sha256": hashlib.sha256(tampered).hexdigest(),
        "quarantined_at": CLOCK,
        "artifact_root": str(roots[0]),
        "moved_to": str(roots[1] / "rec.onnx"),
    }
    # the next start: still missing, still quarantined, the first note kept as it was, nothing re-copied
    again = prepare(roots, bundle)
    assert again.reason == QUARANTINED and [entry.reason for entry in again.quarantined] == ["missing"]
    assert not rec.exists()
    assert note(roots, "rec.onnx")["reason"] == "sha256_mismatch"


def test_a_file_of_another_size_is_quarantined(roots, bundle) -> None:
    prepare(roots, bundle)
    det = roots[0] / "det.onnx"
    os.chmod(det, 0o644)
    det.write_bytes(CONTENT["det"] + b"x")
    state = prepare(roots, bundle)
    assert [(entry.name, entry.reason) for entry in state.quarantined] == [("det.onnx", "size_mismatch")]
    assert note(roots, "det.onnx")["found_sha256"] == hashlib.sha256(CONTENT["det"] + b"x").hexdigest()


def test_a_missing_file_gets_a_note_and_makes_the_models_unusable(roots, bundle) -> None:
    prepare(roots, bundle)
    (roots[0] / "cls.onnx").unlink()
    state = prepare(roots, bundle)
    assert state.reason == QUARANTINED
    assert note(roots, "cls.onnx")["reason"] == "missing"
    assert note(roots, "cls.onnx")["found_sha256"] is None and note(roots, "cls.onnx")["moved_to"] is None


def test_a_symbolic_link_is_quarantined_never_followed(roots, bundle, tmp_path: Path) -> None:
    prepare(roots, bundle)
    elsewhere = tmp_path / "elsewhere.onnx"
    elsewhere.write_bytes(CONTENT["det"])  # even the right content, through a link, is refused
    (roots[0] / "det.onnx").unlink()
    (roots[0] / "det.onnx").symlink_to(elsewhere)
    state = prepare(roots, bundle)
    assert [(entry.name, entry.reason) for entry in state.quarantined] == [("det.onnx", "not_a_regular_file")]
    assert (roots[1] / "det.onnx").is_symlink() and elsewhere.read_bytes() == CONTENT["det"]


def test_a_second_quarantine_of_the_same_name_keeps_the_first(roots, bundle) -> None:
    prepare(roots, bundle)
    for attempt in (b"one", b"two"):
        (roots[0] / MANIFEST_NAME).unlink()  # adopt again: the bundle fills the gap, then tamper
        prepare(roots, bundle)
        os.chmod(roots[0] / "cls.onnx", 0o644)
        (roots[0] / "cls.onnx").write_bytes(attempt)
        assert prepare(roots, bundle).reason == QUARANTINED
    assert (roots[1] / "cls.onnx").read_bytes() == b"one"
    assert (roots[1] / "cls.onnx.1").read_bytes() == b"two"
    assert (
        json.loads((roots[1] / "cls.onnx.1.quarantine.json").read_text())["found_sha256"]
        == hashlib.sha256(b"two").hexdigest()
    )


def test_no_manifest_and_the_bundled_files_present_is_a_first_start(roots, bundle) -> None:
    roots[0].mkdir(parents=True)
    (roots[0] / "det.onnx").write_bytes(CONTENT["det"])  # e.g. copied in by hand, manifest lost
    state = prepare(roots, bundle)
    assert state.usable and state.quarantined == []
    assert (roots[0] / MANIFEST_NAME).exists()


def test_no_manifest_and_a_foreign_file_is_quarantined_and_the_manifest_written(roots, bundle) -> None:
    roots[0].mkdir(parents=True)
    (roots[0] / "rec.onnx").write_bytes(b"not the model")
    state = prepare(roots, bundle)
    assert state.reason == QUARANTINED and [entry.name for entry in state.quarantined] == ["rec.onnx"]
    assert note(roots, "rec.onnx")["reason"] == "size_mismatch"
    # written with the bundled digests, so the quarantined file stays missing instead of being refilled
    assert json.loads((roots[0] / MANIFEST_NAME).read_text())["files"] == [model.entry() for model in MODELS]
    assert prepare(roots, bundle).reason == QUARANTINED
    assert not (roots[0] / "rec.onnx").exists()


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        (b"{not json", "manifest_unreadable"),
        (b'{"format": 2, "files": []}', "manifest_unreadable"),
        (b'{"format": 1, "files": [{"role": "det", "name": "../x", "sha256": "0", "size": 1}]}', "manifest_unreadable"),
        (
            json.dumps({"format": 1, "files": [dict(MODELS[0].entry(), sha256="0" * 64)]}).encode(),
            "manifest_names_other_models",
        ),
    ],
)
def test_a_bad_manifest_is_quarantined_and_the_files_judged_against_the_bundle(roots, bundle, manifest, reason) -> None:
    prepare(roots, bundle)
    (roots[0] / MANIFEST_NAME).write_bytes(manifest)
    state = prepare(roots, bundle)
    assert state.usable, state  # the files are the bundled ones: adopted again
    assert state.manifest_quarantine is not None and state.manifest_quarantine.reason == reason
    assert (roots[1] / MANIFEST_NAME).read_bytes() == manifest
    assert note(roots, MANIFEST_NAME)["reason"] == reason
    assert json.loads((roots[0] / MANIFEST_NAME).read_text())["files"] == [model.entry() for model in MODELS]


def test_a_rewritten_manifest_cannot_launder_a_rewritten_model(roots, bundle) -> None:
    prepare(roots, bundle)
    forged = b"forged recogniser"
    os.chmod(roots[0] / "rec.onnx", 0o644)
    (roots[0] / "rec.onnx").write_bytes(forged)
    entries = [model.entry() for model in MODELS]
    entries[2].update(sha256=hashlib.sha256(forged).hexdigest(), size=len(forged))
    (roots[0] / MANIFEST_NAME).write_text(json.dumps({"format": 1, "files": entries}))
    state = prepare(roots, bundle)
    assert state.reason == QUARANTINED
    assert state.manifest_quarantine is not None and state.manifest_quarantine.reason == "manifest_names_other_models"
    assert (roots[1] / "rec.onnx").read_bytes() == forged


def test_a_missing_or_altered_bundle_populates_nothing(roots, bundle) -> None:
    (bundle / "cls.onnx").write_bytes(b"broken install")
    state = prepare(roots, bundle)
    assert state.reason == "bundled_models_unavailable" and state.paths == {}
    assert not (roots[0] / MANIFEST_NAME).exists()  # retried on the next start, e.g. after a reinstall
    assert not (roots[0] / "cls.onnx").exists()
    assert prepare(roots, None).reason == "bundled_models_unavailable"


def test_an_unwritable_root_is_reported_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageUnusable, match="artifact storage unusable"):
        Artifacts(blocker / "artifacts", tmp_path / "quarantine", models=MODELS).prepare()


def test_model_sha256_is_what_sha256sum_prints(roots, bundle) -> None:
    state = prepare(roots, bundle)
    listing = subprocess.run(
        "LC_ALL=C sha256sum *.onnx | sha256sum", shell=True, cwd=roots[0], capture_output=True, text=True, check=True
    )
    assert state.model_sha256 == listing.stdout.split()[0] == models_digest(MODELS)


def test_the_pins_are_the_installed_wheels_models() -> None:
    folder = bundled_models_dir()
    assert folder is not None
    for model in BUNDLED:
        assert file_digest(folder / model.name) == (model.sha256, model.size), model.name
    assert {model.role for model in BUNDLED} == {"det", "cls", "rec"}


# --- someone who can plant files or links in the root (security pass 2, item 5) ----------------

SECRET = b"someone else's private file"


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    """A mode-0600 file outside the artifact root, which a planted link points at."""
    path = tmp_path / "elsewhere" / "private"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    os.chmod(path, 0o600)
    return path


def untouched(victim: Path) -> bool:
    return stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_bytes() == SECRET


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_a_root_writable_by_group_or_others_is_refused(roots, bundle, which: int, mode: int) -> None:
    for root in roots:
        root.mkdir(parents=True)
    os.chmod(roots[which], mode)
    with pytest.raises(StorageUnusable) as refused:
        prepare(roots, bundle)
    message = refused.value.message
    assert str(roots[which]) in message and f"{stat.S_IMODE(mode):04o}" in message and "chmod go-w" in message
    assert not (roots[0] / MANIFEST_NAME).exists() and not (roots[0] / NAMES["det"]).exists()


def test_a_root_writable_only_by_its_owner_is_used(roots, bundle) -> None:
    for root in roots:
        root.mkdir(parents=True)
        os.chmod(root, 0o700)
    assert prepare(roots, bundle).usable


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_planted_lock_link_is_not_followed(roots, bundle, victim: Path, target_exists: bool) -> None:
    roots[0].mkdir(parents=True)
    target = victim if target_exists else victim.with_name("created-by-the-worker")
    (roots[0] / ".lock").symlink_to(target)
    with pytest.raises(StorageUnusable, match=r"\.lock is a symbolic link"):
        prepare(roots, bundle)
    assert untouched(victim) and not victim.with_name("created-by-the-worker").exists()


def test_the_first_start_temporary_file_is_never_opened_through_a_link(
    roots,
    bundle,
    victim: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the probe's attack: a link planted at the name the first start writes its copy to
    roots[0].mkdir(parents=True)
    planted = roots[0] / ".det.onnx.tmp"
    planted.symlink_to(victim)
    monkeypatch.setattr(files, "temporary_name", lambda path: planted)
    with pytest.raises(StorageUnusable):
        prepare(roots, bundle)
    assert untouched(victim)  # neither written nor made 0444


def test_a_linked_manifest_or_model_is_quarantined_as_a_link_and_its_target_left_alone(
    roots,
    bundle,
    victim: Path,
) -> None:
    prepare(roots, bundle)
    (roots[0] / MANIFEST_NAME).unlink()
    (roots[0] / MANIFEST_NAME).symlink_to(victim)
    os.chmod(roots[0] / NAMES["det"], 0o644)
    (roots[0] / NAMES["det"]).unlink()
    (roots[0] / NAMES["det"]).symlink_to(victim)
    state = Artifacts(roots[0], roots[1], models=MODELS, bundle_dir=bundle).prepare()
    assert state.manifest_quarantine is not None and state.manifest_quarantine.reason == "manifest_not_a_regular_file"
    assert [(entry.name, entry.reason) for entry in state.quarantined] == [(NAMES["det"], "not_a_regular_file")]
    assert (roots[1] / MANIFEST_NAME).is_symlink() and (roots[1] / NAMES["det"]).is_symlink()
    assert untouched(victim)


def test_a_fifo_in_place_of_the_manifest_does_not_hang_the_start(roots, bundle) -> None:
    prepare(roots, bundle)
    (roots[0] / MANIFEST_NAME).unlink()
    os.mkfifo(roots[0] / MANIFEST_NAME)
    state = prepare(roots, bundle)
    assert state.usable and state.manifest_quarantine is not None
    assert state.manifest_quarantine.reason == "manifest_not_a_regular_file"
