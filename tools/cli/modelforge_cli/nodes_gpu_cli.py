"""`modelforge nodes drain|undrain|clear-gpu|accept-gpus`, and the GPU health table of `nodes show`.

Each command posts to the node's admin route and prints the node's GPUs as the control plane now
sees them (docs/API.md, "Admin: GPU health").
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from . import tables
from .admin_api import EXIT_OK, AdminApi, CommandFailed, add_command, add_connection_options, segment

PATH = "/api/v1/admin/nodes"
GPU_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{8,96}\Z")


def register(sub: Any) -> None:
    for name, help_text, description in (
        (
            "drain",
            "stop new work on a node, or on one GPU (--gpu); running jobs finish",
            "Drain a node: it claims no new work, and the jobs it runs finish. With --gpu, only that GPU's slot "
            "stops taking work. Draining twice changes nothing.",
        ),
        ("undrain", "let a drained node or GPU take work again", "Undo `nodes drain` (the same --gpu, if any)."),
    ):
        command = add_command(sub, name, help=help_text, description=description)
        command.add_argument("node_id", metavar="ID", help="the node id (node_...)")
        command.add_argument("--gpu", metavar="UUID", help="one GPU of the node, by its UUID (GPU-...)")
        add_connection_options(command)
        command.set_defaults(admin_handler=run_drain if name == "drain" else run_undrain)

    clear = add_command(
        sub,
        "clear-gpu",
        help="clear a GPU's latched fault after repair",
        description="Clear a GPU's latched hard fault (an Xid that needs a reset, a GPU lost from the bus, "
        "pending row remapping, ...) once it was repaired. The agent re-checks the GPU before it takes work; one "
        "still faulted is latched again. A reboot of the host clears latches by itself.",
    )
    clear.add_argument("node_id", metavar="ID", help="the node id (node_...)")
    clear.add_argument("gpu_uuid", metavar="GPU_UUID", help="the GPU's UUID (GPU-...), as `nodes show` lists it")
    add_connection_options(clear)
    clear.set_defaults(admin_handler=run_clear_gpu)

    accept = add_command(
        sub,
        "accept-gpus",
        help="accept a node's current GPU set (forget GPUs removed on purpose)",
        description="A GPU the node reported before and no longer reports is failed (missing), and the node is "
        "degraded. After removing a GPU on purpose, accept the node's current set.",
    )
    accept.add_argument("node_id", metavar="ID", help="the node id (node_...)")
    add_connection_options(accept)
    accept.set_defaults(admin_handler=run_accept_gpus)


def _gpu_argument(value: str | None) -> str | None:
    if value is not None and not GPU_UUID.fullmatch(value):
        raise CommandFailed(f"--gpu must be a GPU UUID such as GPU-5e1a0000-0000-4000-8000-000000000001, not {value!r}")
    return value


def _post(api: AdminApi, args: argparse.Namespace, action: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    _, node = api.post(f"{PATH}/{segment(args.node_id)}/{action}", body or {})
    return node


def _done(args: argparse.Namespace, node: dict[str, Any], line: str) -> int:
    if args.json:
        tables.print_json(node)
        return EXIT_OK
    print(line)
    table = gpu_table(node)
    if table:
        print("\n" + table)
    return EXIT_OK


def _drain(api: AdminApi, args: argparse.Namespace, drained: bool) -> int:
    gpu = _gpu_argument(args.gpu)
    node = _post(api, args, "drain" if drained else "undrain", {"gpu_uuid": gpu} if gpu else None)
    what = f"GPU {gpu} of node {args.node_id}" if gpu else f"node {args.node_id}"
    verb = "drained: it takes no new work; running jobs finish" if drained else "undrained: it takes work again"
    return _done(args, node, f"{what} {verb}.")


def run_drain(api: AdminApi, args: argparse.Namespace) -> int:
    return _drain(api, args, True)


def run_undrain(api: AdminApi, args: argparse.Namespace) -> int:
    return _drain(api, args, False)


def run_clear_gpu(api: AdminApi, args: argparse.Namespace) -> int:
    if not GPU_UUID.fullmatch(args.gpu_uuid):
        raise CommandFailed(f"GPU_UUID must be a GPU UUID such as GPU-5e1a..., not {args.gpu_uuid!r}")
    node = _post(api, args, f"gpus/{segment(args.gpu_uuid)}/clear")
    return _done(
        args,
        node,
        f"fault of GPU {args.gpu_uuid} cleared: the agent re-checks it at its next heartbeat before it takes work.",
    )


def run_accept_gpus(api: AdminApi, args: argparse.Namespace) -> int:
    node = _post(api, args, "accept-gpus")
    return _done(args, node, f"GPU set of node {args.node_id} accepted: missing GPUs are forgotten.")


def _reasons(gpu: dict[str, Any]) -> str:
    parts = []
    for reason in gpu.get("reasons") or []:
        code = str(reason.get("code"))
        if reason.get("xid") is not None:
            code += f" (Xid {reason['xid']})"
        parts.append(f"{code}: {reason.get('action')}")
    return "; ".join(parts) or "-"


def _marks(gpu: dict[str, Any]) -> str:
    marks = [name for name in ("latched", "drained", "missing") if gpu.get(name)]
    if gpu.get("recheck_pending"):
        marks.append("re-check pending")
    return ", ".join(marks) or "-"


def gpu_table(node: dict[str, Any]) -> str:
    """Each GPU's health, or "" for a node without GPU health (an older agent, or a CPU node)."""
    gpus = [gpu for gpu in node.get("gpu_health") or [] if isinstance(gpu, dict)]
    if not gpus:
        return ""
    rows = [
        [
            gpu.get("uuid"),
            gpu.get("state"),
            "yes" if gpu.get("schedulable") else "no",
            _marks(gpu),
            _reasons(gpu),
        ]
        for gpu in gpus
    ]
    return tables.table(["GPU UUID", "HEALTH", "TAKES WORK", "HELD", "REASONS (ACTION)"], rows)
