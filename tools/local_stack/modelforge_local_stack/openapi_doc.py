"""Write (or check) docs/openapi.json: the API's OpenAPI document, as the control plane serves it
at ``GET /api/v1/openapi.json``.

    python -m modelforge_local_stack.openapi_doc           # regenerate docs/openapi.json
    python -m modelforge_local_stack.openapi_doc --check   # exit 1 if it differs from the generated one
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .catalogue import REPO_ROOT

DOCUMENT_PATH = REPO_ROOT / "docs" / "openapi.json"
REGENERATE = "python -m modelforge_local_stack.openapi_doc"


def render() -> str:
    """The document as the file holds it: two-space indents, fields in the order they are built."""
    from chalicelib.api import openapi

    from .http_server import load_app

    return json.dumps(openapi.build(load_app().app.routes), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelforge_local_stack.openapi_doc", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is out of date")
    parser.add_argument(
        "--output", type=Path, default=DOCUMENT_PATH, help=f"default {DOCUMENT_PATH.relative_to(REPO_ROOT)}"
    )
    args = parser.parse_args(argv)
    wanted = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != wanted:
            print(f"{args.output} is out of date: run `{REGENERATE}`", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.write_text(wanted, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
