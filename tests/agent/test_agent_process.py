"""The agent's entry point as a process: exit codes, messages, and nothing sent when it must
not be (preflight failure, invalid configuration)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from tests.support.agent_process import agent_env, run_agent


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # noqa: BLE001 - any failure means no usable NVML here
        return False


needs_no_gpu = pytest.mark.skipif(
    _gpu_present(), reason="this machine has a working NVML; scripts/gpu-check.sh covers it"
)

TOKEN = "mfe.enr_" + "0" * 32 + "." + "S" * 43


class ConnectionRecorder:
    """A listener on 127.0.0.1 that only counts connections: proof that nothing was sent."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture()
def recorder():  # type: ignore[no-untyped-def]
    listener = ConnectionRecorder()
    yield listener
    listener.close()


def _env(url: str, state: Path, **extra: str) -> dict[str, str]:
    return agent_env(url, TOKEN, state, **extra)


@needs_no_gpu
@pytest.mark.parametrize("mode", ["nvidia", "auto"])
def test_agent_on_this_gpu_less_machine_fails_preflight_with_exit_3_and_sends_nothing(
    recorder: ConnectionRecorder, tmp_path: Path, mode: str
) -> None:
    extra = {"MODELFORGE_AGENT_ACCELERATOR_MODE": mode}
    if mode == "auto":
        extra["NVIDIA_VISIBLE_DEVICES"] = "all"  # devices are advertised, so NVML is required
    done = run_agent(env=_env(recorder.url, tmp_path / "state", **extra))
    assert done.returncode == 3
    codes = [
        code
        for code in ("NVIDIA_NVML_UNAVAILABLE", "NVIDIA_DEVICE_NOT_FOUND", "NVIDIA_TELEMETRY_UNAVAILABLE")
        if code in done.stderr
    ]
    assert codes == ["NVIDIA_NVML_UNAVAILABLE"]
    assert recorder.connections == 0
    assert not (tmp_path / "state" / "identity.json").exists()


@needs_no_gpu
def test_preflight_flag_prints_the_failure_code_and_never_needs_configuration(tmp_path: Path) -> None:
    done = run_agent("--preflight", env={"MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia"})
    assert done.returncode == 3 and done.stderr.startswith("NVIDIA_NVML_UNAVAILABLE: ")
    as_json = run_agent("--preflight", "--json", env={"MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia"})
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["code"] == "NVIDIA_NVML_UNAVAILABLE"


def test_preflight_flag_in_cpu_mode_passes_and_reports_no_gpus() -> None:
    done = run_agent("--preflight", "--json", env={"MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu"})
    assert done.returncode == 0
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["gpus"] == [] and report["nvml_used"] is False


def test_invalid_configuration_exits_2_naming_variables_without_the_token(
    recorder: ConnectionRecorder, tmp_path: Path
) -> None:
    done = run_agent(
        env=_env(
            "https://modelforge.example.internal:8000",
            tmp_path / "state",
            MODELFORGE_AGENT_ACCELERATOR_MODE="gpu",
            MODELFORGE_AGENT_TLS_VERIFY="false",
        )
    )
    assert done.returncode == 2
    for name in (
        "MODELFORGE_AGENT_CONTROL_PLANE_URL",
        "MODELFORGE_AGENT_ACCELERATOR_MODE",
        "MODELFORGE_AGENT_TLS_VERIFY",
    ):
        assert name in done.stderr
    assert "real address" in done.stderr
    assert TOKEN not in done.stdout + done.stderr and TOKEN.rsplit(".", 1)[1] not in done.stderr
    assert recorder.connections == 0


def test_first_start_without_token_exits_2_before_the_preflight_and_creates_no_state_volume(
    recorder: ConnectionRecorder, tmp_path: Path
) -> None:
    env = _env(recorder.url, tmp_path / "volume" / "state", MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia")
    env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] = ""
    done = run_agent(env=env)
    assert done.returncode == 2 and "MODELFORGE_AGENT_ENROLLMENT_TOKEN is required" in done.stderr
    assert "NVIDIA_" not in done.stderr and "preflight_passed" not in done.stderr  # the preflight never ran
    assert not (tmp_path / "volume").exists()
    assert recorder.connections == 0


def test_unwritable_state_volume_exits_4_before_enrolling(recorder: ConnectionRecorder, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    done = run_agent(env=_env(recorder.url, blocker / "state", MODELFORGE_AGENT_ACCELERATOR_MODE="cpu"))
    assert done.returncode == 4 and "not writable" in done.stderr
    assert recorder.connections == 0


@needs_no_gpu
def test_insecure_development_switch_warns_loudly_on_every_start(recorder: ConnectionRecorder, tmp_path: Path) -> None:
    env = _env(
        "https://127.0.0.1:1",
        tmp_path / "state",
        MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia",
        MODELFORGE_AGENT_TLS_VERIFY="false",
        MODELFORGE_AGENT_INSECURE_SKIP_TLS_VERIFY_FOR_DEVELOPMENT="true",
    )
    done = run_agent(env=env)  # the preflight then stops it (exit 3) before any connection
    assert "TLS VERIFICATION IS OFF" in done.stderr
    assert done.returncode == 3
