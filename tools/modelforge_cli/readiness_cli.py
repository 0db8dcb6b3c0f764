"""`modelforge nodes readiness ID`: the readiness answer as a table; exit 0 only when ready."""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Any

import requests
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER

EXIT_READY, EXIT_NOT_READY, EXIT_ERROR = 0, 1, 2


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


def run(target: str, api_url: str, ca_cert: str | None) -> int:
    token = os.environ.get("MODELFORGE_ADMIN_TOKEN", "")
    if not token:
        print("modelforge: set MODELFORGE_ADMIN_TOKEN", file=sys.stderr)
        return EXIT_ERROR
    try:
        response = requests.get(
            f"{api_url.rstrip('/')}/api/v1/admin/nodes/{target}/readiness",
            headers={ADMIN_TOKEN_HEADER: token},
            timeout=30,
            verify=ca_cert or True,
        )
    except requests.RequestException as error:
        print(f"modelforge: cannot reach {api_url}: {type(error).__name__}", file=sys.stderr)
        return EXIT_ERROR
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    if response.status_code != 200:
        code = answer.get("error", {}).get("code", f"HTTP {response.status_code}") if isinstance(answer, dict) else "?"
        print(f"modelforge: readiness refused: {code}", file=sys.stderr)
        return EXIT_ERROR
    print(render(answer))
    return EXIT_READY if answer["ready"] else EXIT_NOT_READY
