"""The control plane's AWS resources, each defined once.

Everything that names a table or the bucket derives from this catalogue: the functions' settings
(which environment variable holds each physical name), the table binding of the PynamoDB models,
the deployed template (`modelforge infra package`: CloudFormation logical ids and each function's
environment), local provisioning and resource names (`modelforge local up`), the state-log replay,
and the tests. Standard library only, so the tools can import it without the functions' runtime.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    """One table or bucket of the control plane, by every name it goes by."""

    #: the logical name, as the state log's changes name their table (``"gpu_claims"``)
    name: str
    #: the environment variable that gives the functions the physical name
    env_var: str
    #: the CloudFormation logical id in infra/resources.json
    logical_id: str
    #: "table" or "bucket"
    kind: str

    def local_name(self, prefix: str) -> str:
        """The physical name in a local stack: ``<prefix>-gpu-claims``."""
        return f"{prefix}-{self.name.replace('_', '-')}"


ENROLLMENTS = Resource("enrollments", "MODELFORGE_ENROLLMENTS_TABLE", "EnrollmentsTable", "table")
NODES = Resource("nodes", "MODELFORGE_NODES_TABLE", "NodesTable", "table")
INVENTORIES = Resource("inventories", "MODELFORGE_INVENTORIES_TABLE", "InventoriesTable", "table")
GPU_CLAIMS = Resource("gpu_claims", "MODELFORGE_GPU_CLAIMS_TABLE", "GpuClaimsTable", "table")
#: fleet-wide state (the sweep's mass-outage hold, the online-node counter); deployed name kept
CONTROL = Resource("control", "MODELFORGE_CONTROL_TABLE", "ControlTable", "table")
OUTBOX = Resource("outbox", "MODELFORGE_OUTBOX_TABLE", "OutboxTable", "table")
WORK = Resource("work", "MODELFORGE_WORK_TABLE", "WorkTable", "table")
STATE_LOG_BUCKET = Resource("state_log", "MODELFORGE_STATE_LOG_BUCKET", "StateLogBucket", "bucket")

TABLES: tuple[Resource, ...] = (ENROLLMENTS, NODES, INVENTORIES, GPU_CLAIMS, CONTROL, WORK, OUTBOX)
ALL: tuple[Resource, ...] = (*TABLES, STATE_LOG_BUCKET)
#: The tables a replay of the state log rebuilds (the outbox is where the log comes from).
REPLAYED_TABLES: tuple[Resource, ...] = tuple(table for table in TABLES if table is not OUTBOX)
#: Where in the state-log bucket each event is written (``events/<event_id>.json``).
STATE_LOG_PREFIX = "events/"
#: Work inputs (``work-inputs/<work_id>.json``, written at submission) and results
#: (``work-results/<work_id>/<epoch>.json``, uploaded by the lease holder), in the same bucket.
WORK_INPUT_PREFIX = "work-inputs/"
WORK_RESULT_PREFIX = "work-results/"
#: Results once their item succeeded (``work-sealed/<work_id>/<epoch>.json``): the control plane
#: copies the checked upload here, where no upload URL reaches, and serves only this copy.
WORK_SEALED_PREFIX = "work-sealed/"


def local_names(prefix: str) -> dict[str, str]:
    """Physical names of every resource in a local stack, by environment variable."""
    return {resource.env_var: resource.local_name(prefix) for resource in ALL}
