"""`modelforge work submit|list|show|cancel|result`: the work queue."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from modelforge_protocol import files
from modelforge_protocol import work as work_protocol

from . import tables
from .admin_api import EXIT_NO, EXIT_OK, AdminApi, CommandFailed, add_command, add_connection_options, segment

PATH = "/api/v1/admin/work"
HEADERS = ["ID", "CAPABILITY", "STATUS", "ATTEMPTS", "NODE", "AGE"]
IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")
DOWNLOAD_TIMEOUT_SECONDS = 60
_CHUNK = 64 * 1024


def register(commands: Any) -> None:
    work = add_command(
        commands,
        "work",
        help="submit work and fetch its result",
        description="The work queue: items of a capability that online nodes claim and run.",
    )
    sub = work.add_subparsers(dest="work_command", required=True, metavar="COMMAND")

    submit = add_command(
        sub,
        "submit",
        help="submit one work item",
        description="Submit one work item. The request body may be up to 5 MiB (the input, base64 included).",
    )
    submit.add_argument(
        "capability",
        metavar="CAPABILITY",
        choices=work_protocol.CAPABILITIES,
        help=f"one of {', '.join(work_protocol.CAPABILITIES)}",
    )
    source = submit.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input", metavar="FILE", type=Path, help="a file holding the input as one JSON object ('-' reads stdin)"
    )
    source.add_argument(
        "--image",
        metavar="FILE",
        type=Path,
        help='a PNG or JPEG image, sent base64-encoded as {"image_base64": ...} (the ocr capability\'s input)',
    )
    submit.add_argument(
        "--detect-rotation",
        action="store_true",
        help='with --image: have the OCR find and turn upside-down lines ({"detect_rotation": true}); off by '
        "default, as it can misread upright pages",
    )
    submit.add_argument(
        "--max-attempts", type=int, metavar="N", help="attempts before the item is dead, 1-10 (API default 3)"
    )
    submit.add_argument(
        "--lease-seconds",
        type=int,
        metavar="SECONDS",
        help="how long a node holds it between renewals, 10-3600 (API default 60)",
    )
    submit.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="8-128 of [A-Za-z0-9._:-]: a retry with the same key and work answers the same item, never a second one",
    )
    add_connection_options(submit)
    submit.set_defaults(admin_handler=run_submit)

    listing = add_command(
        sub, "list", help="work items: status, attempts, node, age", description="List work items (all pages)."
    )
    listing.add_argument("--status", choices=work_protocol.WORK_STATES, help="only items in this state")
    listing.add_argument("--capability", choices=work_protocol.CAPABILITIES, help="only items of this capability")
    add_connection_options(listing, "print the API's JSON answer (every page in one list) instead of a table")
    listing.set_defaults(admin_handler=run_list)

    show = add_command(
        sub,
        "show",
        help="one work item in detail",
        description="Show one work item; exit 1 when there is no such item.",
    )
    show.add_argument("work_id", metavar="ID", help="the work id")
    add_connection_options(show)
    show.set_defaults(admin_handler=run_show)

    cancel = add_command(
        sub,
        "cancel",
        help="cancel a queued or leased item",
        description="Cancel a queued or leased item (its holder's next renewal is refused); a finished item is refused "
        "(work_finished, exit 2).",
    )
    cancel.add_argument("work_id", metavar="ID", help="the work id")
    add_connection_options(cancel)
    cancel.set_defaults(admin_handler=run_cancel)

    result = add_command(
        sub,
        "result",
        help="download a succeeded item's result",
        description="Download the result of a succeeded item from its presigned URL, check its SHA-256 and size, and "
        "write it to stdout or FILE. Exit 1 when the item has no result (yet).",
    )
    result.add_argument("work_id", metavar="ID", help="the work id")
    result.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the result here ('-' or absent: stdout); written only once verified",
    )
    add_connection_options(result, with_json=False)
    result.set_defaults(admin_handler=run_result)


def row(item: dict[str, Any], at: Any = None) -> list[Any]:
    return [
        item.get("work_id"),
        item.get("capability"),
        item.get("status"),
        f"{item.get('attempts', '-')}/{item.get('max_attempts', '-')}",
        item.get("node_id"),
        tables.age(item.get("created_at"), at),
    ]


def describe(item: dict[str, Any]) -> str:
    document = item.get("input") or {}
    result = item.get("result") or {}
    text = tables.fields(
        [
            ("id", item.get("work_id")),
            ("capability", item.get("capability")),
            ("status", item.get("status")),
            ("attempts", f"{item.get('attempts')} of {item.get('max_attempts')}"),
            ("node", item.get("node_id")),
            ("epoch", item.get("epoch")),
            ("lease", f"{item.get('lease_seconds')}s"),
            ("lease expires", tables.when(item.get("lease_expires_at"))),
            ("created", tables.when(item.get("created_at"))),
            ("updated", tables.when(item.get("updated_at"))),
            ("finished", tables.when(item.get("finished_at"))),
            ("input", f"{tables.size(document.get('size'))}, sha256 {document.get('sha256')}" if document else None),
            ("result", f"{tables.size(result.get('size'))}, sha256 {result.get('sha256')}" if result else None),
        ]
    )
    errors = item.get("errors") or []
    if errors:
        rows = [
            [
                error.get("attempt"),
                error.get("epoch"),
                error.get("node_id"),
                error.get("retryable"),
                error.get("at"),
                error.get("reason"),
            ]
            for error in errors
        ]
        text += "\n\n" + tables.table(["ATTEMPT", "EPOCH", "NODE", "RETRYABLE", "AT", "REASON"], rows)
    if result:
        text += f"\n\nresult: modelforge work result {item.get('work_id')} [-o FILE]"
    return text


def _read(path: Path) -> bytes:
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        return path.read_bytes()
    except OSError as error:
        raise CommandFailed(f"cannot read {path}: {error.strerror or error}") from None


def _document(args: argparse.Namespace) -> dict[str, Any]:
    if args.image is not None:
        image = _read(args.image)
        if not image.startswith(IMAGE_SIGNATURES):
            raise CommandFailed(f"{args.image} is not a PNG or JPEG image")
        sent: dict[str, Any] = {"image_base64": base64.b64encode(image).decode("ascii")}
        if args.detect_rotation:
            sent["detect_rotation"] = True
        return sent
    if args.detect_rotation:
        raise CommandFailed(
            '--detect-rotation goes with --image; with --input, put "detect_rotation": true in the JSON'
        )
    raw = _read(args.input)
    name = "stdin" if str(args.input) == "-" else str(args.input)
    try:
        document = json.loads(raw)
    except UnicodeDecodeError:
        raise CommandFailed(f"{name} is not UTF-8 JSON") from None
    except json.JSONDecodeError as error:
        raise CommandFailed(f"{name} is not JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    if not isinstance(document, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(document), "a number"
        )
        raise CommandFailed(f"{name} must hold one JSON object ({{...}}), not {kind}")
    return document


def run_submit(api: AdminApi, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"capability": args.capability, "input": _document(args)}
    for name in ("max_attempts", "lease_seconds", "idempotency_key"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    encoded = len(json.dumps(body).encode())
    if encoded > work_protocol.MAX_SUBMIT_BODY_BYTES:
        raise CommandFailed(
            f"the request would be {tables.size(encoded)}; the API takes at most "
            f"{tables.size(work_protocol.MAX_SUBMIT_BODY_BYTES)} (base64 adds a third to an image)"
        )
    status, item = api.post(PATH, body)
    if args.json:
        tables.print_json(item)
        return EXIT_OK
    work_id = item.get("work_id")
    if status == 200:
        print(f"work {work_id} was already submitted under this idempotency key: {item.get('status')}")
    else:
        print(f"work {work_id} submitted ({item.get('capability')}): {item.get('status')}")
    print(f"follow it: modelforge work show {work_id}    its result: modelforge work result {work_id}")
    return EXIT_OK


def run_list(api: AdminApi, args: argparse.Namespace) -> int:
    params = {name: value for name, value in (("status", args.status), ("capability", args.capability)) if value}
    items = list(api.pages(PATH, "work", params))
    if args.json:
        tables.print_json({"work": items, "next_token": None})
        return EXIT_OK
    if not items:
        print("no work")
        return EXIT_OK
    at = tables.now()
    print(tables.table(HEADERS, [row(item, at) for item in items]))
    return EXIT_OK


def run_show(api: AdminApi, args: argparse.Namespace) -> int:
    item = api.get(f"{PATH}/{segment(args.work_id)}")
    if args.json:
        tables.print_json(item)
    else:
        print(describe(item))
    return EXIT_OK


def run_cancel(api: AdminApi, args: argparse.Namespace) -> int:
    _, item = api.post(f"{PATH}/{segment(args.work_id)}/cancel")
    if args.json:
        tables.print_json(item)
    else:
        print(
            f"work {item.get('work_id')} cancelled (was attempt {item.get('attempts')} of {item.get('max_attempts')})"
        )
    return EXIT_OK


def _no_result(item: dict[str, Any]) -> str:
    status = item.get("status")
    text = f"work {item.get('work_id')} is {status}"
    if status in ("queued", "leased"):
        return text + f" (attempt {item.get('attempts')} of {item.get('max_attempts')}): no result yet"
    errors = item.get("errors") or []
    if status == "dead" and errors:
        after = tables.counted(item.get("attempts"), "attempt")
        return text + f" after {after}, no result; last reason: {errors[-1].get('reason')}"
    return text + ": it has no result"


def download(url: str, size: int, sha256: str) -> bytes:
    """The result behind its presigned URL, checked against the size and SHA-256 the API reported.
    The URL is a bearer secret: no message names more than its host."""
    host = urlsplit(url).netloc or "?"
    try:
        with requests.get(url, stream=True, timeout=DOWNLOAD_TIMEOUT_SECONDS, allow_redirects=False) as response:
            if response.status_code != 200:
                raise CommandFailed(
                    f"the result download from {host} answered HTTP {response.status_code}"
                    " (the URL is valid for 1 hour: run the command again)"
                )
            body = bytearray()
            for chunk in response.iter_content(_CHUNK):
                body += chunk
                if len(body) > size:
                    raise CommandFailed(f"the result from {host} is larger than the {size} bytes the API reported")
    except requests.RequestException as error:
        raise CommandFailed(f"cannot download the result from {host}: {type(error).__name__}") from None
    if len(body) != size:
        raise CommandFailed(f"the result from {host} is {len(body)} bytes, not the {size} the API reported")
    if hashlib.sha256(body).hexdigest() != sha256:
        raise CommandFailed(f"the result from {host} does not match the SHA-256 the API reported")
    return bytes(body)


def _write(path: Path, data: bytes) -> None:
    """All or nothing: a temporary file beside ``path``, renamed over it (mode 0600)."""
    try:
        files.atomic_write(path, data)
    except OSError as error:
        raise CommandFailed(f"cannot write {path}: {error.strerror or error}") from None


def run_result(api: AdminApi, args: argparse.Namespace) -> int:
    item = api.get(f"{PATH}/{segment(args.work_id)}")
    result = item.get("result")
    if item.get("status") != "succeeded" or not isinstance(result, dict):
        raise CommandFailed(_no_result(item), EXIT_NO)
    data = download(str(result["url"]), int(result["size"]), str(result["sha256"]))
    if args.output in (None, "-") and sys.stdout.isatty():
        # a node wrote these bytes: on a terminal, as text with its control characters escaped
        sys.stdout.write(data.decode("utf-8", errors="replace"))
        sys.stdout.flush()
    elif args.output in (None, "-"):
        sys.stdout.buffer.write(data)  # piped or redirected: the verified bytes, as they are
        sys.stdout.buffer.flush()
    else:
        _write(Path(args.output), data)
        print(f"wrote {tables.size(len(data))} to {args.output} (sha256 {result['sha256']} verified)", file=sys.stderr)
    return EXIT_OK
