"""The ModelForge wire contract shared by the control plane, node agent and runtime worker, and
the one copy of each helper they all need.

This is the bottom layer: it imports nothing outside the standard library, and the
three deployables (functions/, agent/, worker/) import it, never each other.

The contract: ``versions``, ``schemas``, ``work``, ``credentials``, ``addresses``,
``image_reference``, ``release_bundle``, ``agent_env``. The shared helpers: ``strict_json``
(parsing untrusted JSON), ``canonical`` (canonical JSON bytes), ``files`` (atomic, durable
writes), ``capped_read`` (bounded HTTP bodies), ``environment`` (every ``MODELFORGE_*`` variable,
the settings reader, the unknown-variable warning), ``backoff`` (1-16 s with jitter),
``http_server`` (the hardened base of the
standard-library HTTP servers).
"""
