"""A small HTTP client for the control plane (admin calls and simulated agents), used by the
integration tests and the benchmarks: tooling, not shipped to nodes or into the Lambda bundle."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import requests
from modelforge_protocol import credentials
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER, NODE_ID_HEADER


def cpu_inventory(cores: int = 2) -> dict[str, Any]:
    return {
        "gpus": [],
        "capabilities": ["cpu"],
        "cpu": {"model": "Test CPU", "logical_cores": cores},
        "memory_total_bytes": 8 * 1024**3,
    }


def gpu_inventory(gpus: int) -> dict[str, Any]:
    """An inventory of ``gpus`` GPUs with UUIDs unique to this call (one physical host)."""
    host = secrets.token_hex(4)
    return {
        "gpus": [
            {
                "index": index,
                "uuid": f"GPU-{host}-aaaa-bbbb-cccc-{index:012d}",
                "name": "NVIDIA H200",
                "memory_total_bytes": 143771336704,
                "driver_version": "570.124.06",
                "cuda_version": "12.8",
            }
            for index in range(gpus)
        ],
        "capabilities": ["cuda", "llm.generate"],
        "cpu": {"model": "AMD EPYC 9654", "logical_cores": 192},
        "memory_total_bytes": 2 * 1024**4,
    }


def gpu_telemetry(gpus: int) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "index": index,
                "utilization_percent": 87.5,
                "memory_used_bytes": 101234567890,
                "memory_total_bytes": 143771336704,
                "temperature_celsius": 64,
                "power_watts": 612.4,
            }
            for index in range(gpus)
        ]
    }


def enroll_body(token: str, identity: AgentIdentity, **overrides: Any) -> dict[str, Any]:
    """A valid enroll request of a CPU node; ``overrides`` replace fields."""
    return {
        "token": token,
        "idempotency_key": identity.idempotency_key,
        "credential": identity.credential,
        "hostname": "gpu_node",
        "agent_version": "1.3.0",
        "protocol_version": 1,
        "accelerator_mode": "cpu",
        "inventory": cpu_inventory(),
        **overrides,
    }


def heartbeat_body(gpus: int = 0, **overrides: Any) -> dict[str, Any]:
    """A valid heartbeat with telemetry for ``gpus`` GPUs; ``overrides`` replace fields."""
    return {
        "protocol_version": 1,
        "agent_version": "1.3.0",
        "health": {"status": "ok"},
        "telemetry": gpu_telemetry(gpus),
        **overrides,
    }


@dataclass
class AgentIdentity:
    """What a real agent creates and persists before it enrolls."""

    credential: str = field(default_factory=credentials.new_node_credential)
    idempotency_key: str = field(default_factory=credentials.new_idempotency_key)
    node_id: str | None = None

    def headers(self) -> dict[str, str]:
        assert self.node_id is not None
        return {"Authorization": f"Bearer {self.credential}", NODE_ID_HEADER: self.node_id}


class ControlPlane:
    def __init__(
        self, base_url: str, admin_token: str, session: requests.Session | None = None, **request_options: Any
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.admin_token = admin_token
        self.session = session or requests.Session()
        self.options = {"timeout": 30, **request_options}

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return self.session.request(method, self.base_url + path, **self.options, **kwargs)

    def admin(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {ADMIN_TOKEN_HEADER: self.admin_token, **kwargs.pop("headers", {})}
        return self.request(method, path, headers=headers, **kwargs)

    def mint(self, display_name: str = "GPU Node", expires_in_seconds: int = 900, **extra: Any) -> dict[str, Any]:
        response = self.admin(
            "POST",
            "/api/v1/admin/node-enrollments",
            json={"display_name": display_name, "expires_in_seconds": expires_in_seconds, **extra},
        )
        assert response.status_code == 201, response.text
        return response.json()

    def enroll_body(self, token: str, identity: AgentIdentity, **overrides: Any) -> dict[str, Any]:
        return enroll_body(token, identity, **overrides)

    def enroll(self, token: str, identity: AgentIdentity, **overrides: Any) -> requests.Response:
        response = self.request("POST", "/api/v1/agent/enroll", json=self.enroll_body(token, identity, **overrides))
        if response.status_code in (200, 201):
            identity.node_id = response.json()["node_id"]
        return response

    def enrolled_node(self, **mint_options: Any) -> AgentIdentity:
        identity = AgentIdentity()
        response = self.enroll(self.mint(**mint_options)["token"], identity)
        assert response.status_code == 201, response.text
        return identity

    def worker_node(self, capabilities: tuple[str, ...] = ("cpu", "ocr", "diagnostic.echo")) -> AgentIdentity:
        """An enrolled node that serves ``capabilities`` (as an agent with a runtime worker does)."""
        identity = AgentIdentity()
        inventory = {**cpu_inventory(), "capabilities": list(capabilities)}
        response = self.enroll(self.mint()["token"], identity, inventory=inventory)
        assert response.status_code == 201, response.text
        return identity

    def submit_work(self, capability: str, document: dict[str, Any], **options: Any) -> requests.Response:
        return self.admin("POST", "/api/v1/admin/work", json={"capability": capability, "input": document, **options})

    def work(self, work_id: str) -> dict[str, Any]:
        response = self.admin("GET", f"/api/v1/admin/work/{work_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def claim(self, identity: AgentIdentity) -> requests.Response:
        return self.request("POST", "/api/v1/agent/work/claim", headers=identity.headers(), json={})

    def lease_call(self, identity: AgentIdentity, work_id: str, action: str, body: dict[str, Any]) -> requests.Response:
        """renew, complete or fail."""
        return self.request("POST", f"/api/v1/agent/work/{work_id}/{action}", headers=identity.headers(), json=body)

    def heartbeat_body(self, gpus: int = 0, **overrides: Any) -> dict[str, Any]:
        return heartbeat_body(gpus, **overrides)

    def heartbeat(self, identity: AgentIdentity, gpus: int = 0, **overrides: Any) -> requests.Response:
        return self.request(
            "POST", "/api/v1/agent/heartbeat", headers=identity.headers(), json=self.heartbeat_body(gpus, **overrides)
        )

    def node(self, node_id: str) -> dict[str, Any]:
        response = self.admin("GET", f"/api/v1/admin/nodes/{node_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def all_nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = []
        token = None
        while True:
            params: dict[str, str] = {"next_token": token} if token else {}
            page = self.admin("GET", "/api/v1/admin/nodes", params=params).json()
            nodes.extend(page["nodes"])
            token = page["next_token"]
            if not token:
                return nodes
