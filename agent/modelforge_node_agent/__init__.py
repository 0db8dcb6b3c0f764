"""ModelForge node agent: outbound-only, runs on every GPU host.

Middle layer: imports only ``modelforge_protocol``, never the control plane.
"""

AGENT_VERSION = "1.3.0"
