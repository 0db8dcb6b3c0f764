"""`modelforge`: run the control plane locally and operate on the state log."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .provision import resource_names
from .replay import TABLE_ENV

if TYPE_CHECKING:
    from .local_stack import LocalOptions

EXIT_OK, EXIT_ERROR, EXIT_CONFIG = 0, 1, 2


def _positive_float(raw: str) -> float:
    value = float(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _sweep_interval_from_env() -> float:
    raw = os.environ.get("MODELFORGE_SWEEP_INTERVAL_SECONDS", "60")
    try:
        return _positive_float(raw)
    except (ValueError, argparse.ArgumentTypeError):
        raise SystemExit("MODELFORGE_SWEEP_INTERVAL_SECONDS must be a number greater than 0") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelforge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="run the control plane on this machine")
    local_commands = local.add_subparsers(dest="local_command", required=True)
    up = local_commands.add_parser("up", help="serve the control plane on a local AWS emulator until Ctrl-C")
    up.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=8000, help="API port (default 8000; 0 picks a free one)")
    up.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate chain (PEM)")
    up.add_argument("--tls-key", type=Path, help="private key for --tls-cert (PEM)")
    up.add_argument("--data-dir", type=Path, help="keep emulator state here across restarts (default: in memory)")
    up.add_argument("--emulator-port", type=int, default=0, help="AWS emulator port (default: a free one)")
    up.add_argument(
        "--connection-timeout",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="close API connections idle, slow or unfinished for this long (default 30)",
    )
    up.add_argument(
        "--max-connections",
        type=_positive_int,
        default=256,
        help="API connections served at once; more are answered 503 server_busy (default 256)",
    )
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
        help="also run a CPU-mode node agent (its own process) that keeps its identity in STATE_DIR",
    )
    up.add_argument(
        "--aws-endpoint-url",
        default=os.environ.get("MODELFORGE_LOCAL_AWS_ENDPOINT_URL"),
        help="use this AWS endpoint (e.g. LocalStack on http://127.0.0.1:4566) instead of the embedded emulator",
    )

    log = commands.add_parser("log", help="the S3 state log")
    log_commands = log.add_subparsers(dest="log_command", required=True)
    replay = log_commands.add_parser("replay", help="rebuild empty tables from the state log")
    replay.add_argument("--endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL"), help="AWS endpoint (emulator)")
    defaults = resource_names("modelforge")
    bucket_var = "MODELFORGE_STATE_LOG_BUCKET"
    replay.add_argument("--bucket", default=os.environ.get(bucket_var, defaults[bucket_var]))
    for logical, env_var in TABLE_ENV.items():
        replay.add_argument(
            f"--{logical.replace('_', '-')}-table",
            dest=f"{logical}_table",
            default=os.environ.get(env_var, defaults[env_var]),
            help=f"target table for {logical} (default ${env_var} or {defaults[env_var]})",
        )
    nodes = commands.add_parser("nodes", help="operate on nodes through the admin API")
    nodes_commands = nodes.add_subparsers(dest="nodes_command", required=True)
    ready = nodes_commands.add_parser("readiness", help="print a node's readiness; exit 0 only when ready")
    ready.add_argument("node_id", help="the node id from the enrollment record (an enrollment id also works)")
    ready.add_argument("--api-url", default=os.environ.get("MODELFORGE_API_URL", "http://127.0.0.1:8000"))
    ready.add_argument("--ca-cert", default=os.environ.get("MODELFORGE_CA_CERT_PATH"), help="private CA of the API")

    token = commands.add_parser("admin-token", help="admin token helpers")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    token_commands.add_parser("new", help="print a new random admin token (stdout) and its SHA-256 (stderr)")

    infra = commands.add_parser("infra", help="deployment artefacts")
    infra_commands = infra.add_subparsers(dest="infra_command", required=True)
    package = infra_commands.add_parser("package", help="build deployment.zip and the CloudFormation template")
    package.add_argument("out_dir", type=Path, help="folder to write deployment.zip and sam.json into")
    package.add_argument("--stage", default="dev")
    return parser


def run_infra_package(args: argparse.Namespace) -> int:
    import subprocess

    from .infra import package

    try:
        template = package(args.out_dir, args.stage)
    except subprocess.CalledProcessError as error:
        print(f"modelforge: chalice package failed with exit code {error.returncode}", file=sys.stderr)
        return EXIT_ERROR
    print(f"wrote {template} and {template.parent / 'deployment.zip'}")
    return EXIT_OK


def run_local_up(args: argparse.Namespace) -> int:
    from .local_stack import LocalOptions

    if args.aws_endpoint_url and args.data_dir:
        print("modelforge: --data-dir applies to the embedded emulator only, not --aws-endpoint-url", file=sys.stderr)
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
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"modelforge: warning: listening on {args.host}, not loopback", file=sys.stderr)
    options = LocalOptions(
        host=args.host,
        port=args.port,
        emulator_port=args.emulator_port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        data_dir=args.data_dir,
        sweep_interval_seconds=_sweep_interval_from_env(),
        aws_endpoint_url=args.aws_endpoint_url,
        connection_timeout_seconds=args.connection_timeout,
        max_connections=args.max_connections,
    )
    if args.with_worker is not None and len(str(args.with_worker.resolve() / "worker.sock")) > 100:
        print("modelforge: --with-worker: the socket path would be too long for a unix socket; use a shorter folder", file=sys.stderr)
        return EXIT_CONFIG
    return serve(options, cpu_agent_state=args.with_cpu_agent, worker_dir=args.with_worker)


def serve(options: LocalOptions, cpu_agent_state: Path | None = None, worker_dir: Path | None = None) -> int:
    """Start the local stack, print the ready line, and serve until SIGINT or SIGTERM."""
    from .http_server import load_app
    from .local_stack import LocalStack

    load_app()
    from chalicelib.settings import SettingsError

    stack = LocalStack(options)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        stack.start()
    except SettingsError as error:
        print(f"modelforge: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as error:
        print(f"modelforge: cannot start: {error.strerror or error}", file=sys.stderr)
        stack.stop()
        return EXIT_ERROR
    if stack.generated_admin_token:
        # shown once, on the terminal of the developer who started the stack
        print(f"admin token (generated, shown once): {stack.generated_admin_token}", flush=True)
    if stack.replayed_requests:
        print(f"restored {stack.replayed_requests} recorded emulator requests from {options.data_dir}", flush=True)
    print(f"modelforge control plane ready at {stack.api_url} (AWS emulator {stack.aws_endpoint_url})", flush=True)
    agent = worker = None
    worker_url = None
    if worker_dir is not None:
        from . import dev_agent

        try:
            worker, worker_url = dev_agent.start_worker(worker_dir.resolve())
        except (dev_agent.DevAgentError, OSError) as error:
            print(f"modelforge: cannot start the runtime worker: {error}", file=sys.stderr)
            stack.stop()
            return EXIT_ERROR
        print(f"runtime worker started (pid {worker.pid}, listening on {worker_url})", flush=True)
    if cpu_agent_state is not None:
        from . import dev_agent

        admin_token = os.environ.get("MODELFORGE_ADMIN_TOKEN") or stack.generated_admin_token
        try:
            agent = dev_agent.start(stack.api_url, admin_token, cpu_agent_state, worker_url)
        except (dev_agent.DevAgentError, OSError) as error:
            print(f"modelforge: cannot start the CPU agent: {error}", file=sys.stderr)
            if worker is not None:
                dev_agent.stop(worker)
            stack.stop()
            return EXIT_ERROR
        print(f"CPU node agent started (pid {agent.pid}, state in {cpu_agent_state})", flush=True)
    stopping.wait()
    if agent is not None:
        dev_agent.stop(agent)
    if worker is not None:
        dev_agent.stop(worker)
    stack.stop()
    print("modelforge control plane stopped", flush=True)
    return EXIT_OK


def run_log_replay(args: argparse.Namespace) -> int:
    from .replay import ReplayError, replay

    tables = {logical: getattr(args, f"{logical}_table") for logical in TABLE_ENV}
    try:
        report = replay(bucket=args.bucket, tables=tables, endpoint_url=args.endpoint_url)
    except ReplayError as error:
        print(f"modelforge: {error}", file=sys.stderr)
        return EXIT_ERROR
    print(f"replayed {report.events} events ({report.writes} writes) into {', '.join(tables.values())}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "local":
        return run_local_up(args)
    if args.command == "infra":
        return run_infra_package(args)
    if args.command == "admin-token":
        from .admin_token import run_new

        return run_new()
    if args.command == "nodes":
        from .readiness_cli import run

        return run(args.node_id, args.api_url, args.ca_cert)
    return run_log_replay(args)


if __name__ == "__main__":
    sys.exit(main())
