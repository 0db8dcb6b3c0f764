"""A stand-in for the `docker` command, for the tests of the node scripts (there is no Docker
engine on the machines that run the suite).

``install(bin_dir, log_dir)`` writes ``bin_dir/docker``; put ``bin_dir`` first on PATH. Each call
appends one JSON object to ``log_dir/calls.jsonl``: its ``argv``, ``env``, ``pid``, and every env
file it was given (``--env-file F`` and ``$MODELFORGE_AGENT_ENV_FILE``) with the file's text and
mode (and its folder's), read while the call runs (the scripts remove the file when they exit). Its answers:

| call (``name``) | answer |
| --- | --- |
| ``image-inspect`` | ``$FAKE_DOCKER_IMAGE_ID`` |
| ``compose-up`` | nothing |
| ``compose-ps`` | ``CONTAINER_ID`` |
| ``inspect`` | ``$FAKE_DOCKER_CONTAINER_IMAGE_ID``, else ``$FAKE_DOCKER_IMAGE_ID`` |
| ``run`` | runs the ``python3 -c CODE ARGS`` it was given with this Python, each argument under the
  ``--mount`` target mapped to the bind source: the scripts' own identity probe, on the test's
  state directory; its exit status and standard error |
| ``rm``, ``stop`` and anything else | nothing |

``FAKE_DOCKER_FAIL=<name>`` makes that call print an error and exit ``FAIL_STATUS``;
``FAKE_DOCKER_HANG=<name>`` makes it write ``log_dir/hanging`` (its pid) and wait to be killed.
Standard library only: it starts once per docker call.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

CONTAINER_ID = "c0ffee0000000000000000000000000000000000000000000000000000000000"
FAIL_STATUS = 17
#: compose's global options that take a value (the scripts pass -f and --env-file)
_COMPOSE_VALUE_OPTIONS = {"-f", "--file", "--env-file", "-p", "--project-name", "--project-directory"}


def install(bin_dir: Path, log_dir: Path) -> Path:
    """Write ``bin_dir/docker``, an executable that runs ``main`` and logs to ``log_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(
        f"#!{sys.executable} -S\n"
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import fake_docker\n"
        f"sys.exit(fake_docker.main(sys.argv[1:], {str(log_dir)!r}))\n"
    )
    docker.chmod(0o755)
    return docker


def call_name(argv: list[str]) -> str:
    if argv[:2] == ["image", "inspect"]:
        return "image-inspect"
    if argv[:1] == ["compose"]:
        rest = argv[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[2:] if rest[0] in _COMPOSE_VALUE_OPTIONS else rest[1:]
        return f"compose-{rest[0]}" if rest else "compose"
    return argv[0] if argv else ""


def _env_files(argv: list[str]) -> dict[str, dict[str, object]]:
    paths = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--env-file"]
    if os.environ.get("MODELFORGE_AGENT_ENV_FILE"):
        paths.append(os.environ["MODELFORGE_AGENT_ENV_FILE"])
    found: dict[str, dict[str, object]] = {}
    for path in paths:
        try:
            found[path] = {
                "text": Path(path).read_text(),
                "mode": os.stat(path).st_mode & 0o7777,
                "folder_mode": os.stat(Path(path).parent).st_mode & 0o7777,
            }
        except OSError as error:
            found[path] = {"error": error.strerror}
    return found


def _bind_mounts(argv: list[str]) -> dict[str, str]:
    """``--mount type=bind,source=S,target=T`` options, as {T: S}."""
    mounts: dict[str, str] = {}
    for i, arg in enumerate(argv[:-1]):
        if arg == "--mount":
            fields = dict(field.partition("=")[::2] for field in next(csv.reader([argv[i + 1]])))
            if fields.get("type") == "bind":
                mounts[fields.get("target") or fields["dst"]] = fields.get("source") or fields["src"]
    return mounts


def _run_container_python(argv: list[str]) -> int:
    """``docker run ... IMAGE python3 -c CODE ARGS``: CODE run here, with the bind mounts' targets
    in ARGS replaced by their sources (what the container would have seen there)."""
    if "-c" not in argv or argv[argv.index("-c") - 1] != "python3":
        print("fake docker: run supports only IMAGE python3 -c CODE ARGS", file=sys.stderr)
        return 125
    code, args = argv[argv.index("-c") + 1], argv[argv.index("-c") + 2 :]
    mounts = _bind_mounts(argv)
    mapped = []
    for arg in args:
        for target, source in mounts.items():
            if arg == target or arg.startswith(target.rstrip("/") + "/"):
                arg = source + arg[len(target) :]
                break
        mapped.append(arg)
    return subprocess.run([sys.executable, "-I", "-c", code, *mapped], check=False).returncode


def _answer(name: str, argv: list[str]) -> int:
    env = os.environ
    if name == "image-inspect":
        print(env.get("FAKE_DOCKER_IMAGE_ID", ""))
    elif name == "compose-ps":
        print(CONTAINER_ID)
    elif name == "inspect":
        print(env.get("FAKE_DOCKER_CONTAINER_IMAGE_ID") or env.get("FAKE_DOCKER_IMAGE_ID", ""))
    elif name == "run":
        return _run_container_python(argv)
    return 0


def main(argv: list[str], log_dir: str) -> int:
    name = call_name(argv)
    record = {"name": name, "argv": argv, "env": dict(os.environ), "pid": os.getpid(), "env_files": _env_files(argv)}
    with open(Path(log_dir) / "calls.jsonl", "a") as log:
        log.write(json.dumps(record) + "\n")
    if os.environ.get("FAKE_DOCKER_HANG") == name:
        (Path(log_dir) / "hanging").write_text(str(os.getpid()))
        while True:
            signal.pause()
    if os.environ.get("FAKE_DOCKER_FAIL") == name:
        print(f"fake docker: {name} failed", file=sys.stderr)
        return FAIL_STATUS
    return _answer(name, argv)
