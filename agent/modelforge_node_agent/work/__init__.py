"""The node's work loop: claim the work the control plane hints at, run it on the runtime worker,
keep its lease, upload its result and complete it (or fail it); one job at a time.

One concern per module, none reaching into another's private members:

- ``claim_loop``: the work thread (wait for a hint, drain, claim) and the publishing thread's side
  (``observe``, ``hint``, ``renew_now``, ``fatal``); ``WorkRunner``.
- ``job``: one job from its claim to its settling, and its ``work_finished`` line.
- ``lease_keeper``: renews the lease every ``lease_seconds / 3`` on its own thread, or at once
  when asked (``renew_now``).
- ``transfers``: presigned GET of the input and PUT of the result (bearer secrets, never logged).
- ``run``: the ``POST /v1/run`` call on its own thread, its ``POST /v1/cancel`` on the worker, and
  what its error means for the work.
- ``settle``: complete or fail, with backoff never past the lease.
- ``worker_view``: the worker's status, polled once per heartbeat.
- ``signals``: stop, hint, and the fatal failure handed to the publishing thread.
- ``claimed``: the claimed ``Lease`` and the ways its job can end (plain data).
- ``timing``: the injected clock and wait.

Control-plane failures are sorted in one place, ``failures.classify``.
"""

from __future__ import annotations

from typing import Any

from ..config import AgentConfig
from ..control_plane import ControlPlaneClient
from ..transport import base_url, build_object_session, build_session
from ..worker_client import WorkerClient
from .claim_loop import WorkRunner
from .transfers import PresignedObjects

__all__ = ["WorkRunner", "for_config"]


def for_config(config: AgentConfig, **options: Any) -> WorkRunner:
    """The work loop of a configuration with ``MODELFORGE_AGENT_WORKER_URL``: its own
    control-plane session (the publishing thread keeps the other), a session for presigned URLs
    and the worker's client."""
    assert config.worker_url is not None
    client = ControlPlaneClient(build_session(config), base_url(config), config.request_timeout_seconds)
    objects = PresignedObjects(build_object_session(config), config.request_timeout_seconds)
    return WorkRunner(client, WorkerClient(config.worker_url), objects, **options)
