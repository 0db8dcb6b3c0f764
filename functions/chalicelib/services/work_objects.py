"""A work item's input and result bytes, read back for admins (the console draws an OCR result
over its image). Presigned URLs name the bucket's host, another origin than the console's, so the
console reads the bytes through the admin API instead. A result is read from its sealed copy
(``work.sealed_key``): what the item's digest was checked against."""

from __future__ import annotations

from modelforge_protocol import work as protocol

from chalicelib.domain.errors import Conflict, NotFound, TooLarge
from chalicelib.services import work
from chalicelib.stores.contract import Stores

#: The most one read answers: a Lambda answer is at most 6 MB, and every input fits (a submission
#: is at most ``MAX_SUBMIT_BODY_BYTES``, 5 MiB); a larger result is fetched from ``result.url``.
MAX_READ_BYTES = protocol.MAX_SUBMIT_BODY_BYTES


def read_input(stores: Stores, work_id: str) -> bytes:
    """The input document as submitted (canonical JSON)."""
    item = work.get(stores, work_id)
    return _read(stores, item.input_key, "input")


def read_result(stores: Stores, work_id: str) -> bytes:
    """The result of a succeeded item, as checked at ``complete``."""
    item = work.get(stores, work_id)
    if item.status != work.SUCCEEDED or item.result is None:
        raise Conflict("result_not_ready", f"the work is {item.status}; only succeeded work has a result")
    return _read(stores, item.result["key"], "result")


def _read(stores: Stores, key: str, what: str) -> bytes:
    found = stores.objects.read(key, MAX_READ_BYTES)
    if found is None:  # the bucket expires work objects after 30 days
        raise NotFound(f"{what}_not_found", f"the {what} is no longer stored (work objects expire after 30 days)")
    if isinstance(found, int):
        raise TooLarge(
            f"{what}_too_large_to_read", f"the {what} is {found} bytes; the API serves at most {MAX_READ_BYTES}"
        )
    return found
