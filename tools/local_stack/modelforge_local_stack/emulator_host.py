"""Where the embedded AWS emulator runs: in the stack's process, or in a process of its own.

The local stack's process serves the API, runs the Chalice handlers and their botocore clients,
and (in process) hosts moto too: under load it is bound by one interpreter's lock, with moto's
parsing about half of the time and the machine's other cores idle (docs/SCALE.md, "What binds
the claims"). ``OwnProcess`` moves moto, with this project's patches and the data dir's
snapshots, into a child process, so that the API and the emulator each get a core; ``modelforge
local up`` runs it that way. ``InProcess`` keeps it in the stack's process, where a benchmark or
a test reads moto's state directly (``bench/cost.py``'s write meter).

Both have the same surface: ``bind()`` takes the port (``PortInUse`` naming ``--emulator-port``),
``start(keep)`` serves and, given a data dir (``Keep``), restores its snapshot and keeps taking
them; ``changes()`` and ``operations()`` are the counters of ``SerializingMiddleware``; ``stop()``
takes the last snapshot and answers the error that kept it from being written, if any.

The child (``OwnProcess``):

- **Started clean**, as local up's other children (``children.start``): ``python -m
  modelforge_local_stack.emulator_host``, with only the environment every child keeps: the admin
  token never reaches it. Its own process group, so a Ctrl-C reaches local up alone, which then
  stops it: the last snapshot is the child's to write.
- **Dies with its parent** (``PR_SET_PDEATHSIG``, armed before it runs), and exits when its
  parent's end of the pipe closes.
- **Spoken to over a socket pair** (``multiprocessing.connection``): one request, one answer, in
  order; an exception in the child comes back as the same exception in the parent.
"""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from . import children
from .emulator import Emulator, SerializingMiddleware
from .persistence import DEFAULT_SNAPSHOT_INTERVAL_SECONDS, Outbox, Persistence, Restored

#: How long the child may take to import moto and bind its port.
START_SECONDS = 120.0
#: How long a request to the child may take (a restore of a large snapshot included).
REQUEST_SECONDS = 600.0
#: How long ``stop()`` waits for the child to exit after its last snapshot.
EXIT_SECONDS = 10.0


@dataclass(frozen=True)
class Keep:
    """What a data dir keeps of the emulator, and how: ``persistence.Persistence``'s arguments."""

    data_dir: Path
    outbox: Outbox | None
    region: str
    snapshot_interval_seconds: float = DEFAULT_SNAPSHOT_INTERVAL_SECONDS


class InProcess:
    """The emulator on threads of this process (see the module's text)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, serialize: bool = True) -> None:
        self.emulator = Emulator(host, port, serialize=serialize)
        self.persistence: Persistence | None = None

    @property
    def endpoint_url(self) -> str:
        return self.emulator.endpoint_url

    @property
    def middleware(self) -> SerializingMiddleware | None:
        """moto's requests, one at a time (``observe`` them in a benchmark); None before ``bind()``."""
        return self.emulator.middleware

    def bind(self) -> None:
        self.emulator.bind()

    def start(self, keep: Keep | None = None) -> Restored | None:
        """Serve; with ``keep``, restore the data dir's snapshot (``SnapshotError`` when it cannot
        be) and take one every ``keep.snapshot_interval_seconds`` while anything changed."""
        self.emulator.start()
        if keep is None:
            return None
        self.persistence = Persistence(keep.data_dir, self.emulator, outbox=keep.outbox, region=keep.region)
        restored = self.persistence.restore()
        self.persistence.start_periodic(keep.snapshot_interval_seconds)
        return restored

    def changes(self) -> int:
        return self.emulator.changes

    def operations(self) -> dict[str, int]:
        assert self.emulator.middleware is not None
        return self.emulator.middleware.snapshot()

    def stop(self) -> Exception | None:
        """Take the last snapshot (when keeping one) and stop serving; the error that kept the
        snapshot from being written (the data dir keeps the one before), else None."""
        failed: Exception | None = None
        if self.persistence is not None:
            try:
                self.persistence.stop()
            except Exception as error:  # noqa: BLE001 - answered to the caller, which reports it
                failed = error
            self.persistence = None
        self.emulator.stop()
        return failed


class EmulatorProcessError(RuntimeError):
    """The emulator's process ended, or stopped answering; the message says which."""


class OwnProcess:
    """The emulator in a child process (see the module's text). ``bind()`` (or ``start()``) from a
    thread that lives as long as the emulator should: the child dies when that thread exits."""

    #: no in-process middleware to observe: the emulator's state is in another process
    middleware = None

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, serialize: bool = True) -> None:
        self.host, self.port, self.serialize = host, port, serialize
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None
        self._lock = threading.Lock()
        self._keeping = False

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def bind(self) -> None:
        """Start the child and have it take the port (its ``PortInUse`` is raised here)."""
        if self._process is not None:
            return
        ours, theirs = socket.socketpair()
        with ours, theirs:
            args = [str(theirs.fileno()), self.host, str(self.port), *([] if self.serialize else ["--no-serialize"])]
            self._process = children.start(
                children.EMULATOR,
                children.environment(children.EMULATOR, {}),
                args=args,
                pass_fds=(theirs.fileno(),),
            )
            self._connection = Connection(ours.detach())
        try:
            self.port = self._answer(START_SECONDS, "bind its port")
        except BaseException:
            self._end()
            raise

    def start(self, keep: Keep | None = None) -> Restored | None:
        self.bind()
        self._keeping = keep is not None
        restored: Restored | None = self._call(("start", keep), "start")
        return restored

    def changes(self) -> int:
        changes: int = self._call(("changes",), "count its writes")
        return changes

    def operations(self) -> dict[str, int]:
        operations: dict[str, int] = self._call(("operations",), "count its operations")
        return operations

    def exit_code(self) -> int | None:
        """The child's exit code once it has exited on its own (None while it runs, or when it
        was never started or was stopped)."""
        return None if self._process is None else self._process.poll()

    def stop(self) -> Exception | None:
        """Have the child take its last snapshot and exit; the error that kept the snapshot from
        being written (or the child from being asked, when it keeps a data dir), else None."""
        if self._process is None:
            return None
        failed: Exception | None = None
        try:
            failed = self._call(("stop",), "take its last snapshot and stop")
        except EmulatorProcessError as error:
            failed = error if self._keeping else None
        finally:
            self._end()
        return failed

    def _call(self, request: tuple[Any, ...], doing: str) -> Any:
        with self._lock:
            if self._connection is None:
                raise EmulatorProcessError(f"the AWS emulator's process is not running (asked to {doing})")
            try:
                self._connection.send(request)
            except OSError:
                raise self._gone(doing) from None
            return self._answer(REQUEST_SECONDS, doing)

    def _answer(self, within: float, doing: str) -> Any:
        assert self._connection is not None
        try:
            if not self._connection.poll(within):
                raise EmulatorProcessError(f"the AWS emulator's process did not {doing} within {within:g} s")
            kind, value = self._connection.recv()
        except (EOFError, OSError):
            raise self._gone(doing) from None
        if kind == "failed":
            raise value
        return value

    def _gone(self, doing: str) -> EmulatorProcessError:
        assert self._process is not None
        try:
            code = self._process.wait(EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        return EmulatorProcessError(
            f"the AWS emulator's process (pid {self._process.pid}) exited (code {code}) when asked to {doing}; "
            "its own error, if any, is above"
        )

    def _end(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            try:
                self._process.wait(EXIT_SECONDS)  # a child whose pipe closed exits by itself
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


# --- the child ---------------------------------------------------------------------------------


def _portable(error: BaseException) -> BaseException:
    """``error`` as it can cross the pipe: itself when it pickles, else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - anything that does not survive the trip
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def serve_parent(connection: Connection, emulator: InProcess) -> None:
    """The child's loop: bind, answer the parent's requests in order, stop on ``stop`` or when the
    parent's end closes (taking the last snapshot either way)."""
    try:
        emulator.bind()
    except Exception as error:  # noqa: BLE001 - the parent raises it
        connection.send(("failed", _portable(error)))
        return
    connection.send(("bound", emulator.emulator.port))
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):  # the parent is gone without asking: keep what we have
            emulator.stop()
            return
        command = request[0]
        try:
            if command == "start":
                answer: Any = emulator.start(request[1])
            elif command == "changes":
                answer = emulator.changes()
            elif command == "operations":
                answer = emulator.operations()
            elif command == "stop":
                connection.send(("stopped", _portable_or_none(emulator.stop())))
                return
            else:
                raise ValueError(f"unknown request {command!r}")
        except Exception as error:  # noqa: BLE001 - the parent raises it
            connection.send(("failed", _portable(error)))
            continue
        connection.send(("answer", answer))


def _portable_or_none(error: Exception | None) -> BaseException | None:
    return None if error is None else _portable(error)


def main(argv: list[str]) -> int:
    fd, host, port = int(argv[0]), argv[1], int(argv[2])
    connection = Connection(fd)
    serve_parent(connection, InProcess(host, port, serialize="--no-serialize" not in argv[3:]))
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
