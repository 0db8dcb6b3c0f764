"""`modelforge nodes list|show|readiness|revoke-credential|delete` (and, from ``nodes_gpu_cli``, drain, undrain,
clear-gpu and accept-gpus): the enrolled nodes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import nodes_gpu_cli, readiness_cli, tables
from .admin_api import EXIT_NO, EXIT_OK, AdminApi, CommandFailed, add_command, add_connection_options, segment

PATH = "/api/v1/admin/nodes"
#: A node's liveness as the API computes it (docs/API.md, "Admin: nodes").
NODE_STATES = ("pending", "online", "stale", "offline")
HEADERS = ["NAME", "NODE ID", "STATUS", "LAST HEARTBEAT", "GPUS", "AGENT", "PROTOCOL", "CHANNEL"]


def register(commands: Any) -> None:
    nodes = add_command(
        commands,
        "nodes",
        help="list, show, check, revoke and delete enrolled nodes",
        description="The nodes enrolled in the control plane.",
    )
    sub = nodes.add_subparsers(dest="nodes_command", required=True, metavar="COMMAND")

    listing = add_command(
        sub,
        "list",
        help="every node: status, last heartbeat, GPUs, versions",
        description="List every node (all pages). STATUS carries ',revoked' when its credential is revoked, "
        "',duplicate' when another node reports one of its GPUs or two agents heartbeat with its identity, "
        "',drained' when an admin drained it and "
        "',gpu-fault' when one of its GPUs takes no work (`nodes show` says which and why). CHANNEL is "
        "'connected' while the node holds a push-channel connection, else 'fallback' (it claims on the "
        "heartbeat's hint; `nodes show` says why).",
    )
    listing.add_argument("--status", choices=NODE_STATES, help="only nodes with this liveness status")
    add_connection_options(listing, "print the API's JSON answer (every page in one list) instead of a table")
    listing.set_defaults(admin_handler=run_list)

    show = add_command(
        sub, "show", help="one node in detail", description="Show one node; exit 1 when there is no such node."
    )
    show.add_argument("node_id", metavar="ID", help="the node id (node_...)")
    add_connection_options(show)
    show.set_defaults(admin_handler=run_show)

    ready = add_command(
        sub,
        "readiness",
        help="print a node's readiness; exit 0 only when ready",
        description="Print a node's readiness checks, each failure with its next step. Exit 0 when ready, "
        "1 when not, 2 on any error (an unknown id included).",
    )
    ready.add_argument(
        "node_id", metavar="ID", help="the node id from the enrollment record (an enrollment id also works)"
    )
    add_connection_options(ready)
    ready.set_defaults(admin_handler=run_readiness)

    revoke = add_command(
        sub,
        "revoke-credential",
        help="revoke a node's credential (asks first unless --yes)",
        description="Revoke a node's credential: its next heartbeat gets 401 credential_revoked and its agent "
        "stops (exit 4). Asks for confirmation on a terminal; without one, --yes is required (else exit 2).",
    )
    revoke.add_argument("node_id", metavar="ID", help="the node id (node_...)")
    revoke.add_argument("--yes", "-y", action="store_true", help="revoke without asking for confirmation")
    add_connection_options(revoke)
    revoke.set_defaults(admin_handler=run_revoke_credential)

    delete = add_command(
        sub,
        "delete",
        help="remove a node whose credential is revoked or that is offline (asks first unless --yes)",
        description="Remove a node whose credential is revoked or that is offline, with everything of it "
        "(inventory, GPU claims and state, duplicate flags, enrollment record); its leased work goes back to the "
        "queue. A node online with an active credential is refused (node_not_removable, exit 2). Asks for "
        "confirmation on a terminal; without one, --yes is required (else exit 2).",
    )
    delete.add_argument("node_id", metavar="ID", help="the node id (node_...)")
    delete.add_argument("--yes", "-y", action="store_true", help="delete without asking for confirmation")
    add_connection_options(delete)
    delete.set_defaults(admin_handler=run_delete)
    nodes_gpu_cli.register(sub)


def _gpus(node: dict[str, Any]) -> Any:
    inventory = node.get("inventory")
    return len(inventory.get("gpus") or []) if isinstance(inventory, dict) else None


def _two_agents(seen_at: Any) -> str | None:
    if not seen_at:
        return None
    return f"heartbeats from two agent processes with this identity (last {seen_at}): stop the extra agent"


def _status(node: dict[str, Any]) -> str:
    marks = [str(node.get("status") or "-")]
    if (node.get("credential") or {}).get("state") == "revoked":
        marks.append("revoked")
    if node.get("duplicate_suspected") or node.get("duplicate_agent_instances_at"):
        marks.append("duplicate")
    if node.get("drained"):
        marks.append("drained")
    if any(not gpu.get("schedulable", True) for gpu in node.get("gpu_health") or []):
        marks.append("gpu-fault")
    return ",".join(marks)


def _protocol(node: dict[str, Any]) -> str:
    version, verdict = node.get("protocol_version"), node.get("protocol_verdict")
    if version is None:
        return "-"
    return str(version) if verdict in (None, "COMPATIBLE") else f"{version} ({verdict})"


def row(node: dict[str, Any], at: Any = None) -> list[Any]:
    return [
        node.get("display_name"),
        node.get("node_id"),
        _status(node),
        tables.age(node.get("last_heartbeat_at"), at),
        _gpus(node),
        node.get("agent_version"),
        _protocol(node),
        node.get("channel") or "-",  # a control plane older than the channel does not say
    ]


def describe(node: dict[str, Any]) -> str:
    credential = node.get("credential") or {}
    health = node.get("health") or {}
    inventory = node.get("inventory") or {}
    hold = node.get("liveness_hold")
    heartbeat = node.get("last_heartbeat_at")
    pairs: list[tuple[str, Any]] = [
        ("name", node.get("display_name")),
        ("node id", node.get("node_id")),
        ("enrollment", node.get("enrollment_id")),
        ("hostname", node.get("hostname")),
        ("status", node.get("status")),
        ("last heartbeat", tables.when(heartbeat) if heartbeat else "never"),
        (
            "credential",
            f"{credential.get('state', '-')} (issued {credential.get('issued_at') or '-'}"
            + (f", revoked {credential['revoked_at']})" if credential.get("revoked_at") else ")"),
        ),
        ("accelerator", node.get("accelerator_mode")),
        ("agent version", node.get("agent_version")),
        ("protocol", _protocol(node)),
        ("health", " ".join(str(part) for part in (health.get("status"), health.get("detail")) if part) or None),
        ("production eligible", node.get("production_eligible")),
        ("duplicate of", ", ".join(node.get("duplicate_suspected") or []) or None),
        ("two agents", _two_agents(node.get("duplicate_agent_instances_at"))),
        ("liveness hold", hold.get("reason") if isinstance(hold, dict) else None),
        ("channel", " ".join(str(part) for part in (node.get("channel"), node.get("channel_reason")) if part) or None),
        ("slots", _slots(node.get("slots"))),
        ("drained", "yes: it takes no new work (modelforge nodes undrain)" if node.get("drained") else None),
        ("simulated", "yes: its GPUs come from an NVML simulation, not hardware" if node.get("simulated") else None),
        ("created", tables.when(node.get("created_at"))),
        ("capabilities", ", ".join(inventory.get("capabilities") or []) or None),
        ("cpu", _cpu(inventory.get("cpu"))),
        ("memory", tables.size(inventory.get("memory_total_bytes")) if inventory.get("memory_total_bytes") else None),
        ("inventory updated", tables.when(inventory.get("updated_at"))),
    ]
    worker = health.get("worker")
    if isinstance(worker, dict):
        pairs.append(("worker", " ".join(str(part) for part in (worker.get("status"), worker.get("detail")) if part)))
    text = tables.fields(pairs)
    gpus = inventory.get("gpus") or []
    if gpus:
        telemetry = {gpu.get("index"): gpu for gpu in ((node.get("telemetry") or {}).get("gpus") or [])}
        rows = []
        for gpu in gpus:
            seen = telemetry.get(gpu.get("index"), {})
            rows.append(
                [
                    gpu.get("index"),
                    gpu.get("name"),
                    tables.size(gpu.get("memory_total_bytes")),
                    f"{seen['utilization_percent']}%" if "utilization_percent" in seen else None,
                    f"{seen['temperature_celsius']}C" if "temperature_celsius" in seen else None,
                    f"{seen['power_watts']}W" if "power_watts" in seen else None,
                    gpu.get("uuid"),
                ]
            )
        text += "\n\n" + tables.table(["GPU", "NAME", "MEMORY", "UTIL", "TEMP", "POWER", "UUID"], rows)
    health_table = nodes_gpu_cli.gpu_table(node)
    if health_table:
        text += "\n\n" + health_table
    return text


def _cpu(cpu: Any) -> str | None:
    if not isinstance(cpu, dict):
        return None
    return f"{cpu.get('model', '-')} ({cpu.get('logical_cores', '?')} logical cores)"


def run_list(api: AdminApi, args: argparse.Namespace) -> int:
    nodes = [node for node in api.pages(PATH, "nodes") if args.status is None or node.get("status") == args.status]
    if args.json:
        tables.print_json({"nodes": nodes, "next_token": None})
        return EXIT_OK
    if not nodes:
        print("no nodes" + (f" with status {args.status}" if args.status else ""))
        return EXIT_OK
    at = tables.now()
    print(tables.table(HEADERS, [row(node, at) for node in nodes]))
    return EXIT_OK


def run_show(api: AdminApi, args: argparse.Namespace) -> int:
    node = api.get(f"{PATH}/{segment(args.node_id)}")
    if args.json:
        tables.print_json(node)
    else:
        print(describe(node))
    return EXIT_OK


def run_readiness(api: AdminApi, args: argparse.Namespace) -> int:
    return readiness_cli.show(api, args.node_id, args.json)


def _confirmed(api: AdminApi, node_id: str, doing: str, question: str) -> bool:
    """Unless ``--yes``: on a terminal, show the node and ask ``question``; without one, refuse."""
    if not sys.stdin.isatty():
        raise CommandFailed(f"{doing} needs confirmation and stdin is not a terminal: pass --yes")
    node = api.get(f"{PATH}/{segment(node_id)}")
    print(tables.table(HEADERS, [row(node)]), file=sys.stderr)
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def run_revoke_credential(api: AdminApi, args: argparse.Namespace) -> int:
    question = (
        "Revoke this node's credential? Its agent stops at its next heartbeat (exit 4) and the host can only "
        "come back by enrolling again with a new token."
    )
    if not args.yes and not _confirmed(api, args.node_id, "revoking a credential", question):
        print("modelforge: not revoked", file=sys.stderr)
        return EXIT_NO
    _, node = api.post(f"{PATH}/{segment(args.node_id)}/revoke-credential")
    if args.json:
        tables.print_json(node)
        return EXIT_OK
    print(
        f"credential of node {node.get('node_id')} ({node.get('display_name')!r}) revoked: its next heartbeat gets "
        "401 credential_revoked and the agent stops (exit 4).\n"
        "To bring the host back: modelforge enrollments create, then on the node move identity.json out of the "
        "agent's state volume and start the agent with the new token."
    )
    return EXIT_OK


def run_delete(api: AdminApi, args: argparse.Namespace) -> int:
    question = (
        "Delete this node and everything of it (inventory, GPU claims and state, duplicate flags, enrollment "
        "record)? Its leased work goes back to the queue; the host can only come back by enrolling again."
    )
    if not args.yes and not _confirmed(api, args.node_id, "deleting a node", question):
        print("modelforge: not deleted", file=sys.stderr)
        return EXIT_NO
    _, removed = api.call("DELETE", f"{PATH}/{segment(args.node_id)}")
    if args.json:
        tables.print_json(removed)
        return EXIT_OK
    reason = "its credential was revoked" if removed.get("reason") == "credential_revoked" else "it was offline"
    print(
        f"node {removed.get('node_id')} deleted ({reason}); {removed.get('leases_released', 0)} leased work "
        "item(s) went back to the queue. An agent still running with its identity gets 401 and exits 4."
    )
    return EXIT_OK


def _slots(slots: Any) -> str | None:
    """``4 (1 busy, 3 schedulable)``; None for a node whose agent does not report them."""
    if not isinstance(slots, dict):
        return None
    return f"{slots.get('total')} ({slots.get('busy')} busy, {slots.get('schedulable')} schedulable)"
