"""The app's routes by who calls them, as the deployed stack exposes them.

Nodes call ``/api/v1/agent/...`` (the HTTP API, ``infra_node_api.py``); admins call
``/api/v1/admin/...`` (the REST API, optionally behind IAM: ``infra_admin_iam.py``); the rest is
public. The lists come from the Chalice app itself, so a route added to ``functions/app.py`` is
deployed where its prefix says without touching the infrastructure code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .catalogue import FUNCTIONS_DIR

NODE_PREFIX = "/api/v1/agent/"
ADMIN_PREFIX = "/api/v1/admin/"
_PARAMETER = re.compile(r"\{[^}/]+\}")


@dataclass(frozen=True, order=True)
class Route:
    path: str
    method: str

    @property
    def key(self) -> str:
        """The HTTP API route key: ``POST /api/v1/agent/heartbeat``."""
        return f"{self.method} {self.path}"

    @property
    def arn_path(self) -> str:
        """The path as an ``execute-api`` ARN names it: each ``{parameter}`` is one ``*``."""
        return _PARAMETER.sub("*", self.path)

    @property
    def logical_name(self) -> str:
        """Letters and digits only (a CloudFormation logical id part): ``PostApiV1AgentWorkWorkIdRenew``."""
        words = re.split(r"[^A-Za-z0-9]+", f"{self.method.lower()} {self.path}")
        return "".join(word[:1].upper() + word[1:] for word in words if word)


def app_routes() -> list[Route]:
    """Every (path, method) of the Chalice app, sorted."""
    from .http_server import load_app

    routes = load_app().app.routes
    return sorted(Route(path, method) for path, methods in routes.items() for method in methods)


def node_routes() -> list[Route]:
    return [route for route in app_routes() if route.path.startswith(NODE_PREFIX)]


def admin_routes() -> list[Route]:
    return [route for route in app_routes() if route.path.startswith(ADMIN_PREFIX)]


def rest_stage(chalice_stage: str = "dev") -> str:
    """The REST API's stage name for a Chalice stage (its ``api_gateway_stage``, else the
    top-level one, else Chalice's default ``api``): the REST API's URLs start with it."""
    config = json.loads((FUNCTIONS_DIR / ".chalice" / "config.json").read_text())
    stage = config.get("stages", {}).get(chalice_stage, {}).get("api_gateway_stage")
    return str(stage or config.get("api_gateway_stage") or "api")
