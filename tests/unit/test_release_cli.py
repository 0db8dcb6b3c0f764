"""`modelforge release manifest|verify|check-container` as an admin runs them: exit codes 0, 1
and 2, one line per reason on stderr, never a traceback; and the real console script once."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from modelforge_cli.cli import main
from modelforge_protocol.release_bundle import bundle_file_name, manifest_file_name
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.support.image_tarballs import release_image, release_images, write_docker_save, write_oci_layout

AGENT = "modelforge-node-agent"
IMAGE_ID = "sha256:" + "ab" * 32
OTHER_ID = "sha256:" + "cd" * 32


def _bundle(tmp_path: Path) -> Path:
    source = write_docker_save(tmp_path / "images.tar", release_images())
    assert main(["release", "manifest", str(source), "--out", str(tmp_path / "bundle")]) == 0
    return tmp_path / "bundle"


def _one_line_errors(err: str) -> list[str]:
    lines = err.splitlines()
    assert lines and all(line.startswith("modelforge: ") for line in lines), err
    assert "Traceback" not in err
    return lines


def test_release_manifest_writes_the_three_files_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _bundle(tmp_path)
    out = capsys.readouterr().out
    assert sorted(path.name for path in folder.iterdir()) == sorted(
        ["SHA256SUMS", bundle_file_name(), manifest_file_name()]
    )
    assert f"({AGENT}:{IMAGE_TAG_VERSION}, modelforge-runtime-worker:{IMAGE_TAG_VERSION})" in out
    assert f"modelforge release verify {folder}" in out


def test_release_manifest_with_expect_takes_only_those_images(tmp_path: Path) -> None:
    source = write_oci_layout(tmp_path / "agent", [release_image(AGENT)])
    assert main(["release", "manifest", str(source), "--out", str(tmp_path / "bundle"), "--expect", AGENT]) == 0
    assert list(json.loads((tmp_path / "bundle" / manifest_file_name()).read_text())["images"]) == [AGENT]


def test_release_manifest_latest_tag_exits_1_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agent, worker = release_images()
    source = write_docker_save(tmp_path / "images.tar", [agent.with_(tags=(f"{AGENT}:latest",)), worker])
    assert main(["release", "manifest", str(source), "--out", str(tmp_path / "bundle")]) == 1
    lines = _one_line_errors(capsys.readouterr().err)
    assert any(f"{AGENT}:latest is the floating latest tag" in line for line in lines)
    assert any(f"missing image {AGENT}:{IMAGE_TAG_VERSION}" in line for line in lines)


def test_release_manifest_missing_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["release", "manifest", str(tmp_path / "absent.tar"), "--out", str(tmp_path / "bundle")]) == 2
    assert _one_line_errors(capsys.readouterr().err) == [
        f"modelforge: {tmp_path / 'absent.tar'}: no such file or folder"
    ]


def test_release_manifest_without_out_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["release", "manifest", str(tmp_path / "images.tar")])
    assert exited.value.code == 2


def test_release_verify_good_bundle_prints_load_command_and_env_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _bundle(tmp_path)
    capsys.readouterr()
    assert main(["release", "verify", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"  docker image load -i {(folder / bundle_file_name()).resolve()}\n" in out
    assert f"  MODELFORGE_NODE_AGENT_IMAGE={AGENT}:{IMAGE_TAG_VERSION}\n" in out
    assert f"docker image inspect --format '{{{{.Id}}}}' {AGENT}:{IMAGE_TAG_VERSION}" in out
    assert f"  MODELFORGE_RUNTIME_WORKER_IMAGE=modelforge-runtime-worker:{IMAGE_TAG_VERSION}\n" in out
    assert "also loaded" not in out


def test_release_verify_image_without_an_env_setting_listed_as_also_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_docker_save(tmp_path / "images.tar", [*release_images(), release_image("modelforge-extra")])
    folder = tmp_path / "bundle"
    assert (
        main(
            [
                "release",
                "manifest",
                str(source),
                "--out",
                str(folder),
                "--expect",
                AGENT,
                "--expect",
                "modelforge-runtime-worker",
                "--expect",
                "modelforge-extra",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["release", "verify", str(folder)]) == 0
    assert f"\nalso loaded: modelforge-extra:{IMAGE_TAG_VERSION}\n" in capsys.readouterr().out


def test_release_verify_tampered_bundle_exits_1_one_line_per_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _bundle(tmp_path)
    (folder / manifest_file_name()).write_text("{}")
    with (folder / bundle_file_name()).open("ab") as tarball:
        tarball.write(b"\0" * 512)
    capsys.readouterr()
    assert main(["release", "verify", str(folder)]) == 1
    lines = _one_line_errors(capsys.readouterr().err)
    assert [line.split(": checksum mismatch")[0] for line in lines] == [
        f"modelforge: SHA256SUMS: {bundle_file_name()}",
        f"modelforge: SHA256SUMS: {manifest_file_name()}",
    ]


def test_release_verify_missing_folder_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["release", "verify", str(tmp_path / "absent")]) == 2
    assert len(_one_line_errors(capsys.readouterr().err)) == 1


def _inspect(tmp_path: Path, image: str) -> Path:
    path = tmp_path / "inspect.json"
    path.write_text(
        json.dumps(
            [
                {
                    "Id": "c0ffee" * 10,
                    "Name": "/node-agent-1",
                    "Image": image,
                    "Config": {"Image": f"{AGENT}:{IMAGE_TAG_VERSION}"},
                }
            ]
        )
    )
    return path


def test_release_check_container_same_image_id_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "release",
                "check-container",
                "--inspect",
                str(_inspect(tmp_path, IMAGE_ID)),
                "--expected-image-id",
                IMAGE_ID,
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == f"node-agent-1 runs {IMAGE_ID}, the image loaded from the bundle\n"


def test_release_check_container_other_image_id_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "release",
                "check-container",
                "--inspect",
                str(_inspect(tmp_path, OTHER_ID)),
                "--expected-image-id",
                IMAGE_ID,
            ]
        )
        == 1
    )
    [line] = _one_line_errors(capsys.readouterr().err)
    assert f"node-agent-1 runs image {OTHER_ID} (started from {AGENT}:{IMAGE_TAG_VERSION}), not {IMAGE_ID}" in line


def test_release_check_container_reads_stdin_and_bare_hex_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(_inspect(tmp_path, IMAGE_ID).read_text()))
    assert main(["release", "check-container", "--expected-image-id", IMAGE_ID.removeprefix("sha256:")]) == 0


@pytest.mark.parametrize(
    ("inspect", "image_id", "says"),
    [
        ("not json", IMAGE_ID, "not JSON"),
        ("[]", IMAGE_ID, "expected the docker inspect output of one container, found 0"),
        (json.dumps([{"Id": "sha256:" + "1" * 64, "RepoTags": []}]), IMAGE_ID, "has no .Image"),
        ("[]", "sha256:abc", "--expected-image-id: 'sha256:abc' is not a full image ID"),
    ],
)
def test_release_check_container_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], inspect: str, image_id: str, says: str
) -> None:
    path = tmp_path / "inspect.json"
    path.write_text(inspect)
    assert main(["release", "check-container", "--inspect", str(path), "--expected-image-id", image_id]) == 2
    [line] = _one_line_errors(capsys.readouterr().err)
    assert says in line


def test_release_verify_console_script_exits_0_on_a_good_bundle(tmp_path: Path) -> None:
    folder = _bundle(tmp_path)
    script = Path(sys.executable).with_name("modelforge")
    done = subprocess.run([str(script), "release", "verify", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"MODELFORGE_NODE_AGENT_IMAGE={AGENT}:{IMAGE_TAG_VERSION}" in done.stdout
