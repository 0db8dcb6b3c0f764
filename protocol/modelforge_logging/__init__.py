"""How every ModelForge process logs (``jsonlog``): shared by the control plane and the node agent,
shipped in the bottom-layer distribution with the wire protocol, but not part of it."""
