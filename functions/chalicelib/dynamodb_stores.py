"""The production stores: DynamoDB tables through PynamoDB."""

from __future__ import annotations

from .enrollment_store import DynamoEnrollmentStore
from .fleet_state_store import DynamoFleetStateStore
from .node_store import DynamoNodeStore
from .stores import Stores


def dynamodb_stores(retention_seconds: int) -> Stores:
    """Stores over the tables ``models.bind_tables`` bound; events kept ``retention_seconds``."""
    return Stores(
        enrollments=DynamoEnrollmentStore(retention_seconds),
        nodes=DynamoNodeStore(retention_seconds),
        fleet=DynamoFleetStateStore(retention_seconds),
    )
