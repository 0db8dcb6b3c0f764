"""The admin commands (`modelforge enrollments|nodes|work`) run as a user runs them: a subprocess
with the API URL and admin token in its environment (never in its arguments) and no terminal on
stdin. Every run is checked never to print a traceback or the admin token."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.api import ControlPlane
from tests.support.processes import cli_command

#: Inherited settings that would change what the commands talk to.
_CLEARED = ("MODELFORGE_API_URL", "MODELFORGE_CA_CERT_PATH", "MODELFORGE_ADMIN_TOKEN")


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def environment(cp: ControlPlane | None, **extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in _CLEARED}
    if cp is not None:
        env["MODELFORGE_API_URL"] = cp.base_url
        env["MODELFORGE_ADMIN_TOKEN"] = cp.admin_token
    env.update(extra)
    return env


def _checked(done: Run, secrets: tuple[str, ...]) -> Run:
    for stream in (done.stdout, done.stderr):
        assert "Traceback" not in stream, stream
        for secret in secrets:
            assert secret not in stream, "the admin token was printed"
    return done


def modelforge(
    cp: ControlPlane | None,
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = 60,
) -> Run:
    """`modelforge ARGS` against ``cp`` (its URL and admin token from the environment)."""
    full_env = environment(cp, **dict(env or {}))
    done = subprocess.run(
        cli_command(*args),
        env=full_env,
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
    )
    secrets = tuple(value for value in (full_env.get("MODELFORGE_ADMIN_TOKEN"),) if value)
    return _checked(
        Run(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")), secrets
    )


def modelforge_on_a_terminal(cp: ControlPlane, *args: str, answer: str, timeout: float = 60) -> Run:
    """`modelforge ARGS` with a terminal on stdin, answering ``answer`` to its prompt."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            cli_command(*args),
            env=environment(cp),
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(terminal)
        terminal = -1
        os.write(controller, answer.encode() + b"\n")
        out, err = process.communicate(timeout=timeout)
    finally:
        if terminal != -1:
            os.close(terminal)
        os.close(controller)
    return _checked(
        Run(process.returncode, out.decode(errors="replace"), err.decode(errors="replace")), (cp.admin_token,)
    )
