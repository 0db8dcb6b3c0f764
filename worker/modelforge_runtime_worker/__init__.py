"""ModelForge runtime worker: a local service on the GPU host that runs model capabilities (OCR)
for the node agent, over a unix socket or a loopback port.

Middle layer: imports only the bottom layer (``modelforge_protocol``, ``modelforge_logging``),
never the agent or the control plane.
"""

from modelforge_protocol.versions import IMAGE_TAG_VERSION, WORKER_PROTOCOL_VERSION

#: What ``GET /v1/status`` reports as ``worker_version`` and ``--version`` prints: the release of
#: this checkout, spelt as people read it (the image tag's SemVer, not the package's PEP 440).
WORKER_VERSION = IMAGE_TAG_VERSION

__all__ = ["WORKER_PROTOCOL_VERSION", "WORKER_VERSION"]
