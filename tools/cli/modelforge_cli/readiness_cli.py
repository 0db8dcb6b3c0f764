"""`modelforge nodes readiness ID`: the readiness answer as a table; exit 0 only when ready."""

from __future__ import annotations

import textwrap
from typing import Any

from . import tables
from .admin_api import EXIT_ERROR, EXIT_NO, EXIT_OK, AdminApi, ApiRefused, CommandFailed, segment

EXIT_READY, EXIT_NOT_READY = EXIT_OK, EXIT_NO


def render(answer: dict[str, Any]) -> str:
    lines = [
        f"node        {answer.get('node_id') or '-'}",
        f"enrollment  {answer.get('enrollment_id') or '-'}",
        f"status      {answer.get('status', '-')}",
        f"ready       {'yes' if answer['ready'] else 'NO'}",
        "",
        f"{'check':<24}{'ok':<6}detail",
    ]
    for check in answer["checks"]:
        lines.append(f"{check['name']:<24}{'yes' if check['ok'] else 'NO':<6}{check['detail']}")
        if check.get("next_step"):
            wrapped = textwrap.wrap(check["next_step"], width=90)
            lines += [f"{'':<30}next: {wrapped[0]}", *(f"{'':<36}{more}" for more in wrapped[1:])]
    return "\n".join(lines)


def show(api: AdminApi, target: str, as_json: bool = False) -> int:
    """Print the readiness of ``target`` (a node id, or the enrollment id that produced it)."""
    try:
        answer = api.get(f"/api/v1/admin/nodes/{segment(target)}/readiness")
    except ApiRefused as refused:
        # an unknown id is an error here (2), as before: the answer asked for is readiness
        raise CommandFailed(f"readiness refused: {refused.message}", EXIT_ERROR) from None
    if as_json:
        tables.print_json(answer)
    else:
        print(render(answer))
    return EXIT_READY if answer["ready"] else EXIT_NOT_READY
