"""A node's non-secret agent settings: the ``.env`` that the console's Enroll node wizard and
``modelforge enrollments create`` hand out, in one order, from one list of names.

The enrollment token is never one of them: ``scripts/node-agent-start.sh`` reads it from the
terminal and passes it to the container in a temporary mode-0600 file.
"""

from __future__ import annotations

import re

from .release_bundle import NODE_AGENT_IMAGE_VARIABLE

#: Always on: a private CA is configured on the node (MODELFORGE_AGENT_CA_CERT_PATH), never bypassed.
TLS_VERIFY = "true"
IDENTITY_MODE = "persisted"
#: The node's durable state directory, where the admin names none.
DEFAULT_STATE_VOLUME = "/var/lib/modelforge/agent-state"
#: The file the start and recreation scripts read, in the node-agent repository.
ENV_FILE = ".env"
WORKER_URL_VARIABLE = "MODELFORGE_AGENT_WORKER_URL"
#: Where the runtime worker's container listens, in the volume it shares with the agent's
#: (docker-compose.yml, docker-compose.runtime-worker.yml).
COMPOSE_WORKER_URL = "unix:///var/lib/modelforge/worker/worker.sock"


def agent_settings(
    *,
    control_plane_url: str,
    accelerator_mode: str,
    state_volume: str,
    image: str | None,
    hostname: str | None = None,
) -> list[tuple[str, str]]:
    """The settings, in order: (name, value). ``hostname`` None leaves the agent's default (the
    host's name: in a container, the container's id). ``image`` None: no container (the agent
    process itself, ``scripts/node-agent-start.sh --no-container``), so no image and no worker
    socket in the Compose volume. A containerised node that may have a GPU gets the runtime
    worker's socket (``docker-compose.runtime-worker.yml``, which reserves the GPUs); a ``cpu``
    node runs no worker container, and its readiness says it serves no work."""
    settings = [("MODELFORGE_AGENT_CONTROL_PLANE_URL", control_plane_url)]
    if hostname:
        settings.append(("MODELFORGE_AGENT_HOSTNAME", hostname))
    settings += [
        ("MODELFORGE_AGENT_ACCELERATOR_MODE", accelerator_mode),
        ("MODELFORGE_AGENT_TLS_VERIFY", TLS_VERIFY),
        ("MODELFORGE_AGENT_STATE_VOLUME", state_volume),
        ("MODELFORGE_AGENT_IDENTITY_MODE", IDENTITY_MODE),
    ]
    if image is not None:
        settings.append((NODE_AGENT_IMAGE_VARIABLE, image))
        if accelerator_mode != "cpu":
            settings.append((WORKER_URL_VARIABLE, COMPOSE_WORKER_URL))
    return settings


def hostname_from(display_name: str) -> str:
    """A hostname suggested from a node's display name (the console's wizard makes the same one):
    lower case, runs of other characters as ``_``, starting with a letter or digit, at most 63."""
    lowered = re.sub(r"[^a-z0-9._-]+", "_", display_name.strip().lower())
    return re.sub(r"^[^a-z0-9]+", "", lowered)[:63]


def env_text(settings: list[tuple[str, str]]) -> str:
    """The ``.env`` file's lines."""
    return "\n".join(f"{name}={value}" for name, value in settings)
