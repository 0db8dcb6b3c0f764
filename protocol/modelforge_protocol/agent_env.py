"""A node's non-secret agent settings: the ``.env`` that the console's Enroll node wizard and
``modelforge enrollments create`` hand out, in one order, from one list of names.

The enrollment token is never one of them: ``scripts/node-agent-start.sh`` reads it from the
terminal and passes it to the container in a temporary mode-0600 file.
"""

from __future__ import annotations

from .release_bundle import NODE_AGENT_IMAGE_VARIABLE

#: Always on: a private CA is configured on the node (MODELFORGE_AGENT_CA_CERT_PATH), never bypassed.
TLS_VERIFY = "true"
IDENTITY_MODE = "persisted"
#: The node's durable state directory, where the admin names none.
DEFAULT_STATE_VOLUME = "/var/lib/modelforge/agent-state"
#: The file the start and recreation scripts read, in the node-agent repository.
ENV_FILE = ".env"


def agent_settings(
    *,
    control_plane_url: str,
    accelerator_mode: str,
    state_volume: str,
    image: str,
    hostname: str | None = None,
) -> list[tuple[str, str]]:
    """The settings, in order: (name, value). ``hostname`` None leaves the agent's default (the
    host's name)."""
    settings = [("MODELFORGE_AGENT_CONTROL_PLANE_URL", control_plane_url)]
    if hostname:
        settings.append(("MODELFORGE_AGENT_HOSTNAME", hostname))
    return settings + [
        ("MODELFORGE_AGENT_ACCELERATOR_MODE", accelerator_mode),
        ("MODELFORGE_AGENT_TLS_VERIFY", TLS_VERIFY),
        ("MODELFORGE_AGENT_STATE_VOLUME", state_volume),
        ("MODELFORGE_AGENT_IDENTITY_MODE", IDENTITY_MODE),
        (NODE_AGENT_IMAGE_VARIABLE, image),
    ]


def env_text(settings: list[tuple[str, str]]) -> str:
    """The ``.env`` file's lines."""
    return "\n".join(f"{name}={value}" for name, value in settings)
