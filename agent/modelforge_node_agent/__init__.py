"""ModelForge node agent: outbound-only, runs on every GPU host.

Middle layer: imports only ``modelforge_protocol``, never the control plane.
"""

from modelforge_protocol.versions import AGENT_VERSION

__all__ = ["AGENT_VERSION"]
