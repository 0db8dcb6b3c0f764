"""`modelforge enrollments create|list|show|revoke`: single-use enrollment tokens for new nodes."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from modelforge_protocol import agent_env, schemas
from modelforge_protocol.addresses import origin_problem
from modelforge_protocol.release_bundle import NODE_AGENT_IMAGE, release_tag

from . import tables
from .admin_api import EXIT_OK, AdminApi, ApiRefused, CommandFailed, add_command, add_connection_options, segment

PATH = "/api/v1/admin/node-enrollments"
EXPIRY_CHOICES = {"5m": 300, "15m": 900, "1h": 3600, "24h": 86400}
MIN_EXPIRY_SECONDS, MAX_EXPIRY_SECONDS = 60, 86400
DEFAULT_NAME = "GPU Node"
#: where nodes reach the control plane, when not at the admin API's URL (a deployed stack: its
#: NodeControlPlaneUrl output, the nodes' HTTP API)
NODE_URL_VAR = "MODELFORGE_NODE_URL"
#: what the agent accepts as MODELFORGE_AGENT_HOSTNAME (the hostname its enroll request carries)
HOSTNAME = re.compile(schemas.HOSTNAME_PATTERN)
_DURATION = re.compile(r"(\d+)([smh]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def expiry_seconds(raw: str) -> int:
    """`5m`, `15m`, `1h`, `24h`, or seconds (also `90s`, `30m`, `2h`): 60 s to 24 h."""
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a duration: use 5m, 15m, 1h, 24h or a number of seconds")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not MIN_EXPIRY_SECONDS <= seconds <= MAX_EXPIRY_SECONDS:
        raise argparse.ArgumentTypeError(f"{raw!r} is outside 60 s to 24 h")
    return seconds


def display_name(raw: str) -> str:
    if not 1 <= len(raw) <= 128:
        raise argparse.ArgumentTypeError("a name is 1 to 128 characters")
    return raw


def register(commands: Any) -> None:
    enrollments = add_command(
        commands,
        "enrollments",
        help="mint, list, show and revoke single-use enrollment tokens",
        description="Single-use, expiring enrollment tokens: a node's agent enrolls once with one.",
    )
    sub = enrollments.add_subparsers(dest="enrollments_command", required=True, metavar="COMMAND")

    create = add_command(
        sub,
        "create",
        help="mint a token; prints it once, with the node's next command",
        description="Mint a single-use enrollment token. The token is printed once (the control plane keeps "
        "only its SHA-256), followed by the agent configuration and the command that starts it on the node.",
    )
    create.add_argument(
        "--name",
        type=display_name,
        default=DEFAULT_NAME,
        help=f"display name of the node it enrolls, 1-128 characters (default {DEFAULT_NAME!r})",
    )
    create.add_argument(
        "--expires",
        type=expiry_seconds,
        default=EXPIRY_CHOICES["15m"],
        metavar="5m|15m|1h|24h|SECONDS",
        help="how long the token stays usable: 60 s to 24 h (default 15m)",
    )
    create.add_argument(
        "--node-url",
        metavar="URL",
        help=f"the control plane's address for nodes, printed as MODELFORGE_AGENT_CONTROL_PLANE_URL (default "
        f"${NODE_URL_VAR}, else the API URL); a deployed stack's is its NodeControlPlaneUrl output",
    )
    create.add_argument(
        "--hostname",
        metavar="NAME",
        help="the node's name as its agent reports it, written to the .env as MODELFORGE_AGENT_HOSTNAME (default: "
        "made from --name, as the console's wizard does); without it a containerised agent reports its container id",
    )
    add_connection_options(create, "print the API's JSON answer (it holds the token) instead of the next steps")
    create.set_defaults(admin_handler=run_create)

    listing = add_command(
        sub, "list", help="every enrollment: status, expiry, node", description="List every enrollment (all pages)."
    )
    add_connection_options(listing)
    listing.set_defaults(admin_handler=run_list)

    show = add_command(
        sub, "show", help="one enrollment", description="Show one enrollment; exit 1 when there is no such enrollment."
    )
    show.add_argument("enrollment_id", metavar="ID", help="the enrollment id (enr_...)")
    add_connection_options(show)
    show.set_defaults(admin_handler=run_show)

    revoke = add_command(
        sub,
        "revoke",
        help="revoke an unused token",
        description="Revoke an enrollment whose token is unused. A used token cannot be revoked: revoke the "
        "node's credential instead (modelforge nodes revoke-credential).",
    )
    revoke.add_argument("enrollment_id", metavar="ID", help="the enrollment id (enr_...)")
    add_connection_options(revoke)
    revoke.set_defaults(admin_handler=run_revoke)


def _row(item: dict[str, Any], at: Any) -> list[Any]:
    return [
        item.get("enrollment_id"),
        item.get("display_name"),
        item.get("status"),
        tables.relative(item.get("expires_at"), at),
        item.get("node_id"),
    ]


HEADERS = ["ID", "NAME", "STATUS", "EXPIRES", "NODE"]


def describe(item: dict[str, Any]) -> str:
    return tables.fields(
        [
            ("id", item.get("enrollment_id")),
            ("name", item.get("display_name")),
            ("status", item.get("status")),
            ("production eligible", item.get("production_eligible")),
            ("created", tables.when(item.get("created_at"))),
            ("expires", tables.when(item.get("expires_at"))),
            ("consumed", tables.when(item.get("consumed_at"))),
            ("revoked", tables.when(item.get("revoked_at"))),
            ("node", item.get("node_id")),
        ]
    )


def node_url(args: argparse.Namespace, api: AdminApi) -> str:
    """``--node-url``, else ``MODELFORGE_NODE_URL``, else the admin API's URL (the local stack
    serves both at one address)."""
    raw = (getattr(args, "node_url", None) or os.environ.get(NODE_URL_VAR) or api.api_url).strip().rstrip("/")
    problem = origin_problem(raw)
    if problem is not None:
        raise CommandFailed(
            f"the node URL must be https://host[:port] with no path, not {raw!r} (--node-url or {NODE_URL_VAR}): "
            f"it {problem}"
        )
    return raw


def node_hostname(args: argparse.Namespace) -> str:
    """``--hostname``, else one made from the display name; refused unless the agent accepts it."""
    hostname = getattr(args, "hostname", None) or agent_env.hostname_from(getattr(args, "name", DEFAULT_NAME))
    if not HOSTNAME.match(hostname):
        raise CommandFailed(
            f"--hostname {hostname!r} is not a hostname the agent accepts: 1 to 253 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit (give --hostname)"
        )
    return hostname


def next_steps(
    minted: dict[str, Any], api: AdminApi, control_plane_url: str | None = None, hostname: str | None = None
) -> str:
    """The token once, on its own line; the node's non-secret .env (the console's settings); and the
    commands that follow, with containers (the agent and the runtime worker) and without: start
    (which asks for the token), drop the token, check readiness."""
    enrollment_id = minted.get("enrollment_id")
    control_plane_url = control_plane_url or api.api_url
    hostname = hostname or agent_env.hostname_from(str(minted.get("display_name") or DEFAULT_NAME))
    ca = [("MODELFORGE_AGENT_CA_CERT_PATH", str(Path(api.ca_cert).resolve()))] if api.ca_cert else []
    common = {
        "control_plane_url": control_plane_url,
        "accelerator_mode": "nvidia",
        "state_volume": agent_env.DEFAULT_STATE_VOLUME,
        "hostname": hostname,
    }
    containers = agent_env.agent_settings(**common, image=release_tag(NODE_AGENT_IMAGE)) + ca
    bare = agent_env.agent_settings(**common, image=None) + ca
    env_file = agent_env.ENV_FILE
    worker = "docker compose -f docker-compose.yml -f docker-compose.runtime-worker.yml"
    lines = [
        f"enrollment {enrollment_id} ({minted.get('display_name')!r}) created; its token expires at "
        f"{minted.get('expires_at')} ({tables.relative(minted.get('expires_at'))}) and works once.",
        "The token is shown only now: the control plane keeps only its SHA-256.",
        "",
        "One-time token (the start command asks for it; never put it in a file or on a command line):",
        "",
        str(minted.get("token")),
        "",
        "1. On the node, in the node-agent repository (the folder with scripts/node-agent-start.sh),",
        f"   write the agent's non-secret settings to {env_file} (accelerator mode cpu for a node without",
        "   NVIDIA GPUs: then drop the MODELFORGE_AGENT_WORKER_URL line, the runtime worker's container",
        "   reserves GPUs; the state volume is a durable directory: the node's identity lives there):",
        "",
        *(
            ["   Copy the API's CA certificate to the node at MODELFORGE_AGENT_CA_CERT_PATH below.", ""]
            if api.ca_cert
            else []
        ),
        f"cat > {env_file} <<'EOF'",
        agent_env.env_text(containers),
        "EOF",
        "",
        "2. Start the runtime worker (it runs the work), then the agent; the script asks for the token",
        "   without echo:",
        "",
        f"{worker} up -d --no-build --pull never runtime-worker",
        f"bash scripts/node-agent-start.sh {env_file}",
        "",
        "3. Once it has enrolled, recreate the container without the token (identity and credential stay):",
        "",
        f"bash scripts/recreate-node-agent.sh {env_file}",
        "",
        f"4. Check it here: modelforge nodes readiness {enrollment_id}",
        "",
        "Without containers (a development or bare-metal node: a checkout with .venv, or the agent's wheels,",
        f"docs/NODES.md), the {env_file} names no image and no worker socket:",
        "",
        f"cat > {env_file} <<'EOF'",
        agent_env.env_text(bare),
        "EOF",
        "",
        "   Start the agent (it runs in the foreground; the script asks for the token without echo):",
        "",
        f"bash scripts/node-agent-start.sh --no-container {env_file}",
        "",
        "   Once it has enrolled, restart it without the token (also the command for every later start):",
        "",
        f"bash scripts/recreate-node-agent.sh --no-container {env_file}",
        "",
        "   To serve work, run the runtime worker beside it and add MODELFORGE_AGENT_WORKER_URL to the .env",
        "   (docs/NODES.md, The runtime worker); without one, readiness says the node serves no work.",
    ]
    return "\n".join(lines)


def run_create(api: AdminApi, args: argparse.Namespace) -> int:
    control_plane_url = node_url(args, api)  # a bad one is refused before a token is minted
    hostname = node_hostname(args)
    _, minted = api.post(PATH, {"display_name": args.name, "expires_in_seconds": args.expires})
    if args.json:
        tables.print_json(minted)
    else:
        print(next_steps(minted, api, control_plane_url, hostname))
    return EXIT_OK


def run_list(api: AdminApi, args: argparse.Namespace) -> int:
    items = list(api.pages(PATH, "enrollments"))
    if args.json:
        tables.print_json({"enrollments": items, "next_token": None})
        return EXIT_OK
    if not items:
        print("no enrollments")
        return EXIT_OK
    at = tables.now()
    print(tables.table(HEADERS, [_row(item, at) for item in items]))
    return EXIT_OK


def run_show(api: AdminApi, args: argparse.Namespace) -> int:
    item = api.get(f"{PATH}/{segment(args.enrollment_id)}")
    if args.json:
        tables.print_json(item)
    else:
        print(describe(item))
    return EXIT_OK


def run_revoke(api: AdminApi, args: argparse.Namespace) -> int:
    try:
        _, item = api.post(f"{PATH}/{segment(args.enrollment_id)}/revoke")
    except ApiRefused as refused:
        if refused.code == "enrollment_consumed":
            node_id = _consumed_by(api, args.enrollment_id)
            if node_id:
                refused.message += f"; run: modelforge nodes revoke-credential {node_id}"
        raise
    if args.json:
        tables.print_json(item)
    else:
        print(f"enrollment {item.get('enrollment_id')} revoked: its token can no longer enroll a node")
    return EXIT_OK


def _consumed_by(api: AdminApi, enrollment_id: str) -> str | None:
    try:
        node_id = api.get(f"{PATH}/{segment(enrollment_id)}").get("node_id")
    except Exception:  # noqa: BLE001 - only a hint: the refusal itself is what is reported
        return None
    return str(node_id) if node_id else None
