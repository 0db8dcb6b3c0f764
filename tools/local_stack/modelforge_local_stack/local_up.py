"""`modelforge local up`: its options, the checks made before anything starts, and the foreground
process that serves until Ctrl-C or SIGTERM (watching its CPU agent and runtime worker)."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelforge_protocol import environment

from . import terminal_lines
from .connection_limits import DEFAULT_CONNECTION_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS
from .invocation_gate import DEFAULT_MAX_INVOCATIONS
from .persistence import DEFAULT_SNAPSHOT_INTERVAL_SECONDS

if TYPE_CHECKING:
    import subprocess

    from .children import ChildFolder
    from .local_stack import LocalOptions, LocalStack

EXIT_OK, EXIT_ERROR, EXIT_CONFIG = 0, 1, 2
#: The control plane's setting --allow-simulated-nodes sets (chalicelib.config.settings reads it).
ALLOW_SIMULATED_NODES_VAR = "MODELFORGE_ALLOW_SIMULATED_NODES"
#: How often the foreground process looks at its agent and worker.
SUPERVISE_SECONDS = 0.5


def positive_float(raw: str) -> float:
    value = float(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _sweep_interval_from_env() -> float:
    raw = os.environ.get("MODELFORGE_SWEEP_INTERVAL_SECONDS", "60")
    try:
        return positive_float(raw)
    except (ValueError, argparse.ArgumentTypeError):
        raise SystemExit("MODELFORGE_SWEEP_INTERVAL_SECONDS must be a number greater than 0") from None


def add_arguments(up: argparse.ArgumentParser) -> None:
    up.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=8000, help="API port (default 8000; 0 picks a free one)")
    up.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate chain (PEM)")
    up.add_argument("--tls-key", type=Path, help="private key for --tls-cert (PEM)")
    up.add_argument(
        "--data-dir",
        type=Path,
        help="keep the tables and the bucket here across restarts (a snapshot on stop and every "
        "--snapshot-interval; default: in memory). One local up per folder: a second is refused",
    )
    up.add_argument(
        "--snapshot-interval",
        type=positive_float,
        default=DEFAULT_SNAPSHOT_INTERVAL_SECONDS,
        metavar="SECONDS",
        help=(
            "with --data-dir: write a snapshot this often while anything changed"
            f" (default {DEFAULT_SNAPSHOT_INTERVAL_SECONDS:g})"
        ),
    )
    up.add_argument("--emulator-port", type=int, default=0, help="AWS emulator port (default: a free one)")
    up.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="keep the admin token in FILE across restarts: read it when FILE exists, else generate one and "
        "write it there (mode 0600). MODELFORGE_ADMIN_TOKEN, when set, wins",
    )
    up.add_argument(
        "--connection-timeout",
        type=positive_float,
        default=DEFAULT_CONNECTION_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="close API connections idle, slow or unfinished for this long "
        f"(default {DEFAULT_CONNECTION_TIMEOUT_SECONDS:g})",
    )
    up.add_argument(
        "--max-connections",
        type=positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        help=f"API connections served at once; more are answered 503 server_busy (default {DEFAULT_MAX_CONNECTIONS})",
    )
    up.add_argument(
        "--max-invocations",
        type=positive_int,
        default=DEFAULT_MAX_INVOCATIONS,
        help="requests the app runs at once; the others wait their turn in arrival order "
        f"(default {DEFAULT_MAX_INVOCATIONS})",
    )
    up.add_argument(
        "--allow-simulated-nodes",
        action="store_true",
        help="accept nodes whose agent runs on an NVML simulation (their inventory says simulated) by setting "
        f"{ALLOW_SIMULATED_NODES_VAR}=true for this control plane; without it they are refused with 403 "
        "simulated_node_refused (default off, as in the deployed stack)",
    )
    up.add_argument(
        "--verbose",
        action="store_true",
        help="show the control plane's routine lines (each request's access line, each state-log shipment) as "
        "info; without it they are at debug, shown only with MODELFORGE_LOG_LEVEL=DEBUG",
    )
    _add_channel_arguments(up)
    up.add_argument(
        "--with-worker",
        type=Path,
        metavar="WORKER_DIR",
        help="also run the runtime worker (its own process) on WORKER_DIR/worker.sock, with its artifact and "
        "quarantine roots in WORKER_DIR; the --with-cpu-agent agent uses it",
    )
    up.add_argument(
        "--with-cpu-agent",
        type=Path,
        metavar="STATE_DIR",
        help="also run a CPU-mode node agent (its own process, text log) that keeps its identity in STATE_DIR; "
        "if it exits, this says why and what to do",
    )
    up.add_argument(
        "--simulated-gpus",
        type=int,
        choices=(4, 8),
        help="with --with-cpu-agent: run that agent as a simulated node with 4 or 8 GPUs (the agent's NVML "
        "simulation; its own state folder beside STATE_DIR, its scenario in simulated-N-gpus.json there, edit it "
        "to inject a fault); implies --allow-simulated-nodes. Off by default: the local agent is a CPU node",
    )
    up.add_argument(
        "--aws-endpoint-url",
        default=os.environ.get("MODELFORGE_LOCAL_AWS_ENDPOINT_URL"),
        help="use this AWS endpoint (e.g. LocalStack on http://127.0.0.1:4566) instead of the embedded emulator",
    )


def _add_channel_arguments(up: argparse.ArgumentParser) -> None:
    up.add_argument(
        "--channel-port",
        type=int,
        metavar="PORT",
        help="the push channel's port on 127.0.0.1: WebSockets at /api/v1/agent/channel and the management "
        "API (/@connections) (default: the API port + 1000; 0 picks a free one)",
    )
    up.add_argument(
        "--channel-max-seconds",
        type=positive_float,
        default=7200.0,
        metavar="SECONDS",
        help="close a channel connection after this long, code 1001 (default 7200: API Gateway's 2 h)",
    )
    up.add_argument(
        "--channel-idle-seconds",
        type=positive_float,
        default=600.0,
        metavar="SECONDS",
        help="close a channel connection after this long without a message from the agent, code 1001 "
        "(default 600: API Gateway's 10 min)",
    )
    up.add_argument(
        "--channel-max-connections",
        type=positive_int,
        default=1000,
        help="channel connections held at once; more are answered 503 (default 1000)",
    )


def _channel_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The channel's options, or None after saying why they cannot be used."""
    from .channel_server import ChannelLimits
    from .local_stack import CHANNEL_PORT_OFFSET

    port = args.channel_port
    if port is None and args.port and args.port + CHANNEL_PORT_OFFSET > 65535:
        _say(
            f"--port {args.port}: the channel's default port (+{CHANNEL_PORT_OFFSET}) is too high; give --channel-port"
        )
        return None
    if port is not None and not 0 <= port <= 65535:
        _say("--channel-port must be 0..65535")
        return None
    limits = ChannelLimits(
        max_seconds=args.channel_max_seconds,
        idle_seconds=args.channel_idle_seconds,
        max_connections=args.channel_max_connections,
    )
    return {"channel_port": port, "channel_limits": limits}


def run(args: argparse.Namespace) -> int:
    from .local_stack import LocalOptions

    for _name, warning in environment.unknown_variable_warnings(os.environ):
        print(f"modelforge: warning: {warning}", file=sys.stderr)
    if args.aws_endpoint_url and args.data_dir:
        print("modelforge: --data-dir applies to the embedded emulator only, not --aws-endpoint-url", file=sys.stderr)
        return EXIT_CONFIG
    if args.simulated_gpus and not args.with_cpu_agent:
        print(
            "modelforge: --simulated-gpus runs the --with-cpu-agent agent as a simulated node: give both",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.with_cpu_agent and args.tls_cert:
        print("modelforge: --with-cpu-agent runs over plain HTTP on loopback; leave out --tls-cert", file=sys.stderr)
        return EXIT_CONFIG
    if bool(args.tls_cert) != bool(args.tls_key):
        print("modelforge: --tls-cert and --tls-key must be given together", file=sys.stderr)
        return EXIT_CONFIG
    for path in (args.tls_cert, args.tls_key):
        if path is not None and not path.is_file():
            print(f"modelforge: no such file: {path}", file=sys.stderr)
            return EXIT_CONFIG
    channel = _channel_options(args)
    if channel is None:
        return EXIT_CONFIG
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"modelforge: warning: listening on {args.host}, not loopback", file=sys.stderr)
    options = LocalOptions(
        host=args.host,
        port=args.port,
        emulator_port=args.emulator_port,
        emulator_process=True,  # the API and moto on a core each
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        data_dir=args.data_dir,
        snapshot_interval_seconds=args.snapshot_interval,
        sweep_interval_seconds=_sweep_interval_from_env(),
        aws_endpoint_url=args.aws_endpoint_url,
        connection_timeout_seconds=args.connection_timeout,
        max_connections=args.max_connections,
        max_invocations=args.max_invocations,
        admin_token_file=args.admin_token_file,
        extra_env={ALLOW_SIMULATED_NODES_VAR: "true"} if args.allow_simulated_nodes or args.simulated_gpus else {},
        **channel,
    )
    if args.with_worker is not None and len(str(args.with_worker.resolve() / "worker.sock")) > 100:
        print(
            "modelforge: --with-worker: the socket path would be too long for a unix socket; use a shorter folder",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    terminal_lines.quiet_routine_lines(quiet=not args.verbose)
    return serve(
        options, cpu_agent_state=args.with_cpu_agent, worker_dir=args.with_worker, simulated_gpus=args.simulated_gpus
    )


def _say(line: str) -> None:
    print(f"modelforge: {line}", file=sys.stderr, flush=True)


def _admin_token_line(stack: LocalStack, token_file: Path | None) -> str | None:
    if token_file is None:
        if stack.admin_token_source == "generated":
            # shown once, on the terminal of the developer who started the stack
            return f"admin token (generated, shown once): {stack.generated_admin_token}"
        return None
    use = f"KEY=$(cat {shlex.quote(str(token_file))})"
    if stack.admin_token_source == "generated":
        return f"admin token generated and kept in {token_file} (mode 0600; MODELFORGE_ADMIN_TOKEN overrides it): {use}"
    if stack.admin_token_source == "file":
        return f"admin token kept in {token_file} (MODELFORGE_ADMIN_TOKEN overrides it): {use}"
    return f"admin token from MODELFORGE_ADMIN_TOKEN ({token_file} is not used)"


def _start(stack: LocalStack, options: LocalOptions) -> int | None:
    """Start the stack; the exit code when it cannot start (one line said why), else None."""
    from chalicelib.config.settings import SettingsError

    from .local_stack import AdminTokenFileError
    from .persistence import DataDirInUse, SnapshotError

    try:
        stack.start()
    except SettingsError as error:
        stack.stop()
        source = ""
        if stack.admin_token_source == "file" and "MODELFORGE_ADMIN_TOKEN" in str(error):
            source = f" (the admin token was read from {options.admin_token_file}: fix it, or delete it for a new one)"
        _say(f"{error}{source}")
        return EXIT_CONFIG
    except AdminTokenFileError as error:
        stack.stop()
        _say(str(error))
        return EXIT_CONFIG
    except (DataDirInUse, SnapshotError) as error:
        stack.stop()
        _say(str(error))
        return EXIT_ERROR
    except OSError as error:
        stack.stop()
        _say(f"cannot start: {error.strerror or error}")
        return EXIT_ERROR
    return None


def _print_ready(stack: LocalStack, options: LocalOptions) -> None:
    """The admin token (when generated), what the data dir held, the channel, and the ready line last."""
    token_line = _admin_token_line(stack, options.admin_token_file)
    if token_line:
        print(token_line, flush=True)
    if stack.restored is not None and options.data_dir is not None:
        print(stack.restored.describe(options.data_dir), flush=True)
    if stack.allow_simulated_nodes:
        print(
            f"simulated nodes accepted ({ALLOW_SIMULATED_NODES_VAR}=true): a node on an NVML simulation enrolls, "
            "and its views say simulated",
            flush=True,
        )
    if stack.channel is not None:
        channel = stack.channel
        print(f"push channel at {channel.channel_url} (management API {channel.management_url})", flush=True)
    print(f"modelforge control plane ready at {stack.api_url} (AWS emulator {stack.aws_endpoint_url})", flush=True)


def _claim_folders(worker_dir: Path | None, agent_dir: Path | None) -> list[ChildFolder] | None:
    """Hold the worker's and the agent's folders for this local up; None after saying why one is
    not free (another local up holds it, or a process left running uses it)."""
    from . import children

    claimed: list[children.ChildFolder] = []
    for folder, kind in ((worker_dir, children.WORKER), (agent_dir, children.AGENT)):
        if folder is None:
            continue
        claim = children.ChildFolder(folder, kind)
        try:
            claim.claim()
        except (children.FolderInUse, OSError) as error:
            _say(str(error) if isinstance(error, children.FolderInUse) else f"cannot use {folder}: {error}")
            for held in claimed:
                held.release()
            return None
        claimed.append(claim)
    return claimed


def _start_children(
    stack: LocalStack, worker_dir: Path | None, agent_dir: Path | None, simulation: Path | None, gpus: int | None
) -> tuple[subprocess.Popen | None, subprocess.Popen | None, str | None] | None:
    """Start the worker and the agent (from this, the main, thread: they die with it); (agent,
    worker, the worker's URL), or None after saying why one could not start (nothing left running)."""
    from . import dev_agent

    agent = worker = worker_url = None
    if worker_dir is not None:
        try:
            worker, worker_url = dev_agent.start_worker(worker_dir)
        except (dev_agent.DevAgentError, OSError) as error:
            _say(f"cannot start the runtime worker: {error}")
            return None
        print(f"runtime worker started (pid {worker.pid}, listening on {worker_url})", flush=True)
    if agent_dir is not None:
        try:
            agent = dev_agent.start(stack.api_url, stack.admin_token, agent_dir, worker_url, simulation)
        except (dev_agent.DevAgentError, OSError) as error:
            _say(f"cannot start the CPU agent: {error}")
            if worker is not None:
                dev_agent.stop(worker)
            return None
        if simulation is not None:
            print(
                f"simulated {gpus}-GPU node agent started (pid {agent.pid}, state in {agent_dir}); "
                f'its GPUs are not real. To inject a fault, add {{"uuid": "<a GPU\'s UUID>", "xid": 48}} to '
                f"xid_events in {simulation}",
                flush=True,
            )
        else:
            print(f"CPU node agent started (pid {agent.pid}, state in {agent_dir})", flush=True)
    return agent, worker, worker_url


def serve(
    options: LocalOptions,
    cpu_agent_state: Path | None = None,
    worker_dir: Path | None = None,
    simulated_gpus: int | None = None,
) -> int:
    """Start the local stack, print the ready line, and serve until SIGINT or SIGTERM."""
    from . import dev_agent

    worker_dir = worker_dir.resolve() if worker_dir is not None else None
    agent_dir = cpu_agent_state  # as given: the paths the agent's messages name
    simulation = None
    if agent_dir is not None and simulated_gpus:
        agent_dir, simulation = dev_agent.simulation_files(agent_dir, simulated_gpus)
    folders = _claim_folders(worker_dir, agent_dir)
    if folders is None:
        return EXIT_ERROR
    try:
        return _serve(options, worker_dir, agent_dir, simulation, simulated_gpus)
    finally:
        for folder in folders:
            folder.release()


def _serve(
    options: LocalOptions,
    worker_dir: Path | None,
    agent_dir: Path | None,
    simulation: Path | None,
    simulated_gpus: int | None,
) -> int:
    from . import dev_agent
    from .http_server import load_app
    from .local_stack import LocalStack

    load_app()
    stack = LocalStack(options)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    failed = _start(stack, options)
    if failed is not None:
        return failed
    _print_ready(stack, options)
    started = _start_children(stack, worker_dir, agent_dir, simulation, simulated_gpus)
    if started is None:
        stack.stop()
        return EXIT_ERROR
    agent, worker, worker_url = started
    # the token's file, unless the user's environment gave the token (local up puts the file's
    # token into its own environment too, so the environment cannot tell)
    token_file = options.admin_token_file if stack.admin_token_source != "environment" else None
    print(terminal_lines.where_line(stack.api_url, token_file), flush=True)
    supervisor = dev_agent.Supervisor(
        stack.api_url, stack.admin_token, agent_dir, worker_url, agent, worker, say=_say, simulation=simulation
    )
    emulator_exit: int | None = None
    while emulator_exit is None and not stopping.wait(SUPERVISE_SECONDS):
        supervisor.check()
        emulator_exit = stack.emulator_exit_code()
    supervisor.stop()
    stack.stop()
    if emulator_exit is not None:
        from .children import how_it_ended

        kept = f"; the data dir keeps its last snapshot ({options.data_dir})" if options.data_dir else ""
        _say(
            f"the AWS emulator's process {how_it_ended(emulator_exit)}: the control plane cannot serve without it,"
            f" so it stopped{kept}"
        )
        return EXIT_ERROR
    if stack.save_error is not None:
        _say(
            f"could not save the data dir {options.data_dir} ({type(stack.save_error).__name__}: {stack.save_error}); "
            "it keeps the snapshot taken before"
        )
        return EXIT_ERROR
    print("modelforge control plane stopped", flush=True)
    return EXIT_OK
