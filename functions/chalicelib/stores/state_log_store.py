"""The S3 side of the state log: immutable event objects, one per event id."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from chalicelib.stores.state_log import state_log_key

_ALREADY_WRITTEN = {"PreconditionFailed", "ConditionalRequestConflict", "412"}


def ship(s3: Any, bucket: str, event_id: str, payload: str) -> bool:
    """Write the event unless it is already there. True if this call wrote it.

    ``IfNoneMatch='*'`` makes the write create-only, so a redelivered stream record is
    harmless and an event, once written, never changes.
    """
    try:
        s3.put_object(
            Bucket=bucket,
            Key=state_log_key(event_id),
            Body=payload.encode("utf-8"),
            ContentType="application/json",
            IfNoneMatch="*",
        )
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in _ALREADY_WRITTEN:
            return False
        raise
    return True
