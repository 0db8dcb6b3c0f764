"""The worker's configuration: validated whole, every problem named by its variable, and the
process refuses it with exit 2 and one line, never a traceback, before it creates anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from modelforge_runtime_worker.config import DEFAULTS, load_config, parse_listen
from modelforge_runtime_worker.errors import ConfigurationInvalid

from tests.worker.worker_support import run_worker_to_exit, worker_env


def test_defaults() -> None:
    config = load_config({})
    assert config.listen.path == Path("/var/lib/modelforge/worker/worker.sock")
    assert config.artifact_root == Path("/var/lib/modelforge/artifacts")
    assert config.quarantine_root == Path("/var/lib/modelforge/quarantine")
    assert (config.device, config.job_timeout_seconds, config.log_level) == ("auto", 120.0, "INFO")
    assert (config.slots, config.decode_timeout_seconds, config.decode_memory_bytes) == (1, 20.0, 1024 * 1024 * 1024)
    assert set(DEFAULTS) == {
        "MODELFORGE_WORKER_LISTEN",
        "MODELFORGE_WORKER_ARTIFACT_ROOT",
        "MODELFORGE_WORKER_QUARANTINE_ROOT",
        "MODELFORGE_WORKER_DEVICE",
        "MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS",
        "MODELFORGE_WORKER_LOG_LEVEL",
        "MODELFORGE_WORKER_SLOTS",
        "MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS",
        "MODELFORGE_WORKER_DECODE_MEMORY_MB",
    }


def test_the_decode_cap_defaults_within_a_shorter_job_timeout_and_may_not_be_set_longer() -> None:
    assert load_config({"MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS": "5"}).decode_timeout_seconds == 5.0
    with pytest.raises(ConfigurationInvalid, match="DECODE_TIMEOUT_SECONDS must not be longer"):
        load_config({"MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS": "5", "MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS": "6"})


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("MODELFORGE_WORKER_SLOTS", "0", "between 1 and 64"),
        ("MODELFORGE_WORKER_SLOTS", "65", "between 1 and 64"),
        ("MODELFORGE_WORKER_SLOTS", "two", "must be an integer"),
        ("MODELFORGE_WORKER_DECODE_MEMORY_MB", "64", "between 128 and 65536"),
        ("MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS", "0", "between 1 and 600"),
        ("MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS", "nan", "between 1 and 600"),
    ],
)
def test_slots_and_decoder_limits_are_bounded(name: str, value: str, says: str) -> None:
    with pytest.raises(ConfigurationInvalid, match=says):
        load_config({name: value})


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("http://127.0.0.1:8085", "127.0.0.1", 8085),
        ("http://127.0.0.2:0", "127.0.0.2", 0),
        ("http://[::1]:9000", "::1", 9000),
        ("http://localhost:9000", "127.0.0.1", 9000),
        ("http://LOCALHOST:9000/", "127.0.0.1", 9000),
    ],
)
def test_loopback_http_is_accepted(url: str, host: str, port: int) -> None:
    problems: list[str] = []
    listen = parse_listen(url, problems)
    assert problems == [] and listen is not None
    assert (listen.host, listen.port, listen.is_unix) == (host, port, False)


def test_a_unix_socket_is_accepted() -> None:
    listen = parse_listen("unix:///run/modelforge/w.sock", [])
    assert listen is not None and listen.path == Path("/run/modelforge/w.sock") and listen.is_unix


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://0.0.0.0:8080", "loopback"),
        ("http://10.1.2.3:8080", "loopback"),
        ("http://[::]:8080", "loopback"),
        ("http://worker.example.com:8080", "loopback"),
        ("https://127.0.0.1:8080", "unix:/// or http://"),
        ("http://127.0.0.1", "must name a port"),
        ("http://127.0.0.1:99999", "invalid port"),
        ("http://127.0.0.1:80/api", "no path"),
        ("unix://relative/worker.sock", "absolute path"),
        ("unix:///run/modelforge/", "not a directory"),
        ("unix:///" + "x" * 120, "107 bytes"),
        ("tcp://127.0.0.1:80", "unix:/// or http://"),
    ],
)
def test_other_addresses_are_refused_by_name(url: str, says: str) -> None:
    with pytest.raises(ConfigurationInvalid) as refused:
        load_config({"MODELFORGE_WORKER_LISTEN": url})
    assert len(refused.value.problems) == 1
    assert refused.value.problems[0].startswith("MODELFORGE_WORKER_LISTEN")
    assert says in refused.value.problems[0]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigurationInvalid) as refused:
        load_config(
            {
                "MODELFORGE_WORKER_LISTEN": "http://192.168.1.10:80",
                "MODELFORGE_WORKER_ARTIFACT_ROOT": "relative/artifacts",
                "MODELFORGE_WORKER_QUARANTINE_ROOT": str(a_file),
                "MODELFORGE_WORKER_DEVICE": "tpu",
                "MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS": "nan",
                "MODELFORGE_WORKER_LOG_LEVEL": "chatty",
            }
        )
    named = [problem.split(" ")[0] for problem in refused.value.problems]
    assert named == [
        "MODELFORGE_WORKER_LISTEN",
        "MODELFORGE_WORKER_ARTIFACT_ROOT",
        "MODELFORGE_WORKER_QUARANTINE_ROOT",
        "MODELFORGE_WORKER_DEVICE",
        "MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS",
        "MODELFORGE_WORKER_LOG_LEVEL",
    ]


@pytest.mark.parametrize("timeout", ["0", "0.5", "3601", "-1", "inf", "two"])
def test_job_timeout_bounds(timeout: str) -> None:
    with pytest.raises(ConfigurationInvalid, match="MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS"):
        load_config({"MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS": timeout})


def test_values_are_normalised() -> None:
    config = load_config(
        {
            "MODELFORGE_WORKER_DEVICE": " CUDA ",
            "MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS": "2.5",
            "MODELFORGE_WORKER_LOG_LEVEL": "debug",
            "MODELFORGE_WORKER_ARTIFACT_ROOT": "/srv/models/../artifacts",
        }
    )
    assert (config.device, config.job_timeout_seconds, config.log_level) == ("cuda", 2.5, "DEBUG")
    assert config.artifact_root == Path("/srv/artifacts")


@pytest.mark.parametrize(
    ("artifacts", "quarantine"),
    [("/srv/m", "/srv/m"), ("/srv/m", "/srv/m/quarantine"), ("/srv/m/artifacts", "/srv/m")],
)
def test_the_two_roots_must_be_apart(artifacts: str, quarantine: str) -> None:
    with pytest.raises(ConfigurationInvalid, match="separate directories"):
        load_config({"MODELFORGE_WORKER_ARTIFACT_ROOT": artifacts, "MODELFORGE_WORKER_QUARANTINE_ROOT": quarantine})


def test_the_process_refuses_a_non_loopback_address_with_exit_2_and_one_line(tmp_path: Path) -> None:
    env = worker_env(tmp_path, MODELFORGE_WORKER_LISTEN="http://0.0.0.0:8085", MODELFORGE_WORKER_DEVICE="gpu")
    done = run_worker_to_exit(env)
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert record["event"] == "worker_exit" and record["exit_code"] == 2
    assert "MODELFORGE_WORKER_LISTEN must be a loopback address" in record["message"]
    assert "MODELFORGE_WORKER_DEVICE must be one of auto, cpu, cuda" in record["message"]
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created: no socket, no artifact or quarantine root


@pytest.mark.parametrize(("slots", "cores", "threads"), [(1, 16, None), (2, 2, 1), (3, 2, 1), (4, 16, 4), (3, 16, 5)])
def test_slots_share_the_cores_among_their_onnxruntime_sessions(slots: int, cores: int, threads: int | None) -> None:
    from modelforge_runtime_worker.main import slot_start

    config = load_config({"MODELFORGE_WORKER_SLOTS": str(slots)})
    assert slot_start(config, cores)["threads"] == threads
