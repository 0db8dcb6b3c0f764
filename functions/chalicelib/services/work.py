"""The work queue: submit, claim, renew, complete, fail and cancel work; the sweep's lease expiry.

States: ``queued`` → (claim) ``leased`` → ``succeeded`` (complete), back to ``queued`` (a retryable
failure, an expired lease, the holder going offline) or ``dead`` (no attempt left, or a failure
that is not retryable); ``queued``/``leased`` → ``cancelled``. Every claim is an attempt and
raises the item's ``epoch``: the fencing token that renew, complete and fail must present, so a
holder that lost its lease (expired, cancelled, re-claimed) can change nothing. Every change,
lease renewals included, is one guarded write with its state-log event, so a replay rebuilds
every item exactly.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modelforge_protocol import work as protocol
from modelforge_protocol.canonical import canonical_bytes

from chalicelib.config.resources import WORK_INPUT_PREFIX, WORK_RESULT_PREFIX, WORK_SEALED_PREFIX
from chalicelib.config.settings import Settings
from chalicelib.domain import requests
from chalicelib.domain.errors import Conflict, GuardFailed, Invalid, TooLarge, Unauthenticated, not_found
from chalicelib.domain.records import Event, Node, WorkItem
from chalicelib.domain.validation import validate_with
from chalicelib.services import dispatch
from chalicelib.services.auth import NodeCaller, require_holder
from chalicelib.services.known_callers import ClaimView, KnownCallers
from chalicelib.services.queue_fronts import QueueFronts
from chalicelib.stores.contract import Holder, LeaseCheck, Stores

QUEUED, LEASED, SUCCEEDED, DEAD, CANCELLED = protocol.WORK_STATES
#: How a refusal names a finished item (never "is already succeeded").
_FINISHED = {
    SUCCEEDED: "the work already succeeded",
    DEAD: "the work is already dead",
    CANCELLED: "the work was already cancelled",
}
#: Queued items a claim reads per capability and read: the front of one part of the queue (the
#: store spreads each queue over parts). The claim tries them in random order, so concurrent
#: claimers that read the same front spread over it instead of all racing for its oldest item.
#: 100 claimers over 16 shards x 20 candidates lost 0.27 transactions per claim; with 10
#: candidates, 0.45 (docs/SCALE.md). A read of 20 items is still a few read units.
CLAIM_CANDIDATES = 20
#: A claim tries one candidate per round: a remembered one (queue_fronts.py), else the first of a
#: fresh read. A lost try means others are taking items from that front, so the front is forgotten
#: and the next round reads the queue again (another part, chosen at random) rather than spend a
#: transaction on a front that is going stale. Reads are cheaper than transactions on DynamoDB (a
#: lost transaction still costs its write units). Measured at 100 claimers: 1.35 transactions per
#: claim with one try per read, 1.46 with two (docs/SCALE.md).
CLAIM_ROUNDS = 4
#: How long presigned URLs stay valid beyond the lease (a renewed lease outlives its claim's URLs:
#: the agent downloads at once and uploads before completing).
URL_SLACK_SECONDS = 300
RESULT_URL_SECONDS = 3600
#: Node faults an item goes back from without counting an attempt (its worker was busy, its GPU
#: faulted); later ones count as ordinary retryable failures.
MAX_NODE_FAULTS = 8
#: Expired leases one sweep takes back (the rest wait for the next sweep).
EXPIRED_PER_SWEEP = 200
_WORK_ID = re.compile(protocol.WORK_ID_PATTERN)
_PNG, _JPEG = b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"


def input_key(work_id: str, input_sha256: str) -> str:
    """Named by its digest too: two racing submits with one idempotency key and different inputs
    write different objects, so the winner's item always points at the winner's input."""
    return f"{WORK_INPUT_PREFIX}{work_id}/{input_sha256}.json"


def result_key(work_id: str, epoch: int) -> str:
    """Each claim uploads to its own object: a fenced-off holder cannot overwrite the winner's."""
    return f"{WORK_RESULT_PREFIX}{work_id}/{epoch}.json"


def sealed_key(work_id: str, epoch: int) -> str:
    """Where a succeeded item's result is kept: the upload URL stays valid after ``complete`` (for
    the lease plus ``URL_SLACK_SECONDS``), so the checked bytes are copied where no URL reaches."""
    return f"{WORK_SEALED_PREFIX}{work_id}/{epoch}.json"


# --- submitting, reading, cancelling (admin) ----------------------------------------------


def _check_input(capability: str, document: dict[str, Any]) -> None:
    validate_with(document, protocol.INPUTS[capability], "input")
    if capability == protocol.OCR:
        try:
            image = base64.b64decode(document["image_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise Invalid("invalid_input", "input/image_base64: is not valid base64") from None
        if not image.startswith((_PNG, _JPEG)):
            raise Invalid("invalid_input", "input/image_base64: is not a PNG or JPEG image")


@dataclass(frozen=True)
class Submitted:
    item: WorkItem
    #: False when an idempotent retry found the item its first attempt made
    created: bool


def _same_submission(existing: WorkItem, wanted: WorkItem) -> Submitted:
    same = ("capability", "input_sha256", "max_attempts", "lease_seconds")
    if any(getattr(existing, name) != getattr(wanted, name) for name in same):
        raise Conflict("idempotency_key_reused", "this idempotency_key was used for different work")
    return Submitted(existing, created=False)


def submit(stores: Stores, request: requests.SubmitWork, now: float) -> Submitted:
    capability = request.capability
    _check_input(capability, request.input)
    document = canonical_bytes(request.input)
    input_sha256 = hashlib.sha256(document).hexdigest()
    key = request.idempotency_key
    key_sha256 = hashlib.sha256(key.encode("utf-8")).hexdigest() if key else None
    # an idempotent submit names its item after the key, so a retry finds it with one read
    work_id = f"work_{key_sha256[:32]}" if key_sha256 else f"work_{uuid.uuid4().hex}"
    item = WorkItem(
        work_id=work_id,
        capability=capability,
        status=QUEUED,
        created_at=round(now, 3),
        updated_at=round(now, 3),
        attempts=0,
        max_attempts=request.max_attempts,
        lease_seconds=request.lease_seconds,
        epoch=0,
        input_key=input_key(work_id, input_sha256),
        input_sha256=input_sha256,
        input_size=len(document),
        idempotency_key_sha256=key_sha256,
        queued_at=round(now, 3),
    )
    if key_sha256:
        existing = stores.work.get(work_id)
        if existing is not None:
            return _same_submission(existing, item)
    stores.objects.put(item.input_key, document, "application/json")
    try:
        stores.work.create(item, Event("work.submitted", {"work_id": work_id, "capability": capability}, now))
    except GuardFailed:
        existing = stores.work.get(work_id)  # the same key submitted concurrently: one item
        if existing is None:
            raise
        return _same_submission(existing, item)
    dispatch.wake(stores, capability, now)  # after the item's write: see dispatch.py (no lost wake-up)
    return Submitted(item, created=True)


def get(stores: Stores, work_id: str) -> WorkItem:
    item = stores.work.get(work_id) if _WORK_ID.fullmatch(work_id) else None
    if item is None:
        raise not_found("work")
    return item


def cancel(stores: Stores, work_id: str, now: float) -> WorkItem:
    for _ in range(CLAIM_ROUNDS):
        item = get(stores, work_id)
        if item.status in protocol.FINAL_STATES:
            raise Conflict("work_finished", f"{_FINISHED[item.status]}; only queued or leased work can be cancelled")
        event = Event("work.cancelled", {"work_id": work_id, "from": item.status}, now)
        try:
            cancelled = stores.work.cancel(item, now, event)
        except GuardFailed:
            continue  # claimed, failed or finished meanwhile: judge again
        if item.status == LEASED:  # the holder renews at once: its renewal's 409 stops the job
            dispatch.notify_cancel(stores, item.node_id, work_id)
        return cancelled
    raise Conflict("work_conflict", "the work changed concurrently; retry")


# --- the lease holder (node agent) --------------------------------------------------------


def authenticate(stores: Stores, caller: NodeCaller, known: KnownCallers | None) -> Node | None:
    """Prove the caller before anything is written: a caller this instance has verified costs
    nothing here (every write checks the credential again); any other is read once. The node
    read, or None for a known caller."""
    key = (caller.node_id, caller.credential_sha256)
    if known is not None and key in known:
        return None
    node = require_holder(stores.nodes.get(caller.node_id), caller)
    if known is not None:
        known.remember(key)
    return node


@dataclass(frozen=True)
class Claim:
    item: WorkItem
    input_url: str
    result_upload_url: str


def claim(
    stores: Stores,
    settings: Settings,
    caller: NodeCaller,
    now: float,
    known: KnownCallers | None = None,
    fronts: QueueFronts | None = None,
) -> Claim | None:
    """A claimable item of a capability the node serves, leased to it in one transaction that also
    checks, at the moment of the write, that the node holds its active credential, is online by
    its heartbeat's age, serves the item's capability and is parked as the claim believes; None
    when nothing is claimable.

    The claim acts on a view of its node: the one this instance remembered from an earlier claim
    (``known``: no read), or a fresh node read. Because the transaction checks every fact the view
    supplied, an out-of-date view costs one lost transaction and a read, never a wrong lease. A
    queue that looks empty is judged on a fresh read (parking needs the node's channel). See
    docs/DISPATCH.md, "The claim's view of its node".

    The item comes from the queue's front as this instance last read it (``fronts``: the untried
    rest of an earlier read, one item per claim) or from a fresh read; the transaction requires
    the item still queued at the epoch read, so a remembered item taken elsewhere costs one lost
    transaction, after which the front is read again. See docs/SCALE.md, "The claim".
    """
    return _Claimer(stores, caller, now, now - settings.stale_after_seconds, known, fronts).claim()


class _Claimer:
    """One claim request: its node view, and up to ``CLAIM_ROUNDS`` candidates (remembered, or
    read), one lease transaction each."""

    def __init__(
        self,
        stores: Stores,
        caller: NodeCaller,
        now: float,
        heartbeat_after: float,
        known: KnownCallers | None,
        fronts: QueueFronts | None,
    ) -> None:
        self.stores, self.caller, self.now, self.heartbeat_after = stores, caller, now, heartbeat_after
        self.known, self.fronts = known, fronts
        self.key = (caller.node_id, caller.credential_sha256)
        self.holder = Holder(caller.node_id, caller.credential_sha256)
        #: the node as read by this request (None while the claim acts on a remembered view)
        self.node: Node | None = None
        remembered = known.claim_view(self.key, now) if known is not None else None
        self.view = remembered if remembered is not None and remembered.online(heartbeat_after) else self._read()

    def claim(self) -> Claim | None:
        leased = self._lease_queued()
        if leased is not None:
            self.view = self.view.took_slot()
        self._remember()
        if leased is None:
            return None
        # a parked node that took an item is idle no more (the lease checked the stamp)
        dispatch.claimed(self.stores, self.caller.node_id, self.view.capabilities, self.view.parked_at)
        return _claim_answer(self.stores, leased)

    def _read(self) -> ClaimView:
        """Read the node: 401 unless the caller holds its active credential, 409 unless online."""
        try:
            node = require_holder(self.stores.nodes.get(self.caller.node_id), self.caller)
            view = ClaimView.of(node, self.now)
            if not view.online(self.heartbeat_after):
                raise _not_online()
        except (Unauthenticated, Conflict):
            if self.known is not None:
                self.known.forget(self.key)  # its next request is read (and costs nothing) again
            raise
        self.node = node
        return view

    def _capabilities(self) -> list[str]:
        """What the node may claim now: nothing while an admin drains it, or while every slot it
        may use holds a lease (judged on a fresh read: a remembered view may be out of date)."""
        if self.view.drained or not self.view.slot_free:
            return []
        return sorted(self.view.capabilities & set(protocol.CAPABILITIES))

    def _lease_queued(self) -> WorkItem | None:
        """The item leased, or None when a read found nothing queued or every try was lost. A read
        that finds nothing parks a connected node, then reads once more (check, park, re-check:
        docs/DISPATCH.md). A revoked or no longer online node raises (401, 409) as its read decides."""
        for _ in range(CLAIM_ROUNDS):
            capabilities = self._capabilities()
            if not capabilities:
                if self.node is None:  # a remembered view: judge on a fresh read
                    self.view = self._read()
                    continue
                return None
            candidate = self._candidate(capabilities)
            if candidate is None:
                return None
            leased = self._try(candidate)
            if leased is not None:
                return leased
        return None

    def _candidate(self, capabilities: list[str]) -> WorkItem | None:
        """An item of the front this instance remembers, else the first of a fresh read (its
        untried rest remembered); None when a fresh read, and the look after parking, found
        nothing. Emptiness is never taken from memory."""
        if self.fronts is not None:
            remembered = self.fronts.take(capabilities, self.now)
            if remembered is not None:
                return remembered
        candidates = _candidates(self.stores, capabilities)
        if not candidates:
            candidates = self._park_and_look_again(capabilities)
        if not candidates:
            return None
        first, *rest = candidates
        if self.fronts is not None:
            self.fronts.keep(capabilities, rest, self.now)
        return first

    def _park_and_look_again(self, capabilities: list[str]) -> list[WorkItem]:
        """Nothing queued: park a connected node (on a fresh read) and look once more."""
        if self.node is None:
            self.view = self._read()
            if self._capabilities() != capabilities:
                return []  # it serves something else now: the next round reads those queues
        assert self.node is not None
        if not dispatch.park(self.stores, self.node, self.holder, capabilities, self.now):
            return []
        self.view = ClaimView.of(self.node, self.now)  # parked: the next lease must say so
        return _candidates(self.stores, capabilities)  # parked: look once more (no lost wake-up)

    def _try(self, candidate: WorkItem) -> WorkItem | None:
        event = Event(
            "work.leased",
            {"work_id": candidate.work_id, "node_id": self.caller.node_id, "epoch": str(candidate.epoch + 1)},
            self.now,
        )
        until = self.now + candidate.lease_seconds
        try:
            return self.stores.work.lease(
                candidate, self.holder, self.heartbeat_after, until, self.now, event, parked_at=self.view.parked_at
            )
        except GuardFailed as lost:
            if "work" in lost.failed and self.fronts is not None:
                self.fronts.forget(candidate.capability, self.now)  # others are taking from that front
            if "node" in lost.failed:
                # revoked, not online, or not as the view says (capabilities, park state): the
                # read raises for the first two, and gives the next round a true view
                self.view = self._read()
            return None  # otherwise another node took the item

    def _remember(self) -> None:
        """Keep the view for this node's next claim; never a parked one (a wake un-parks the node
        behind this instance's back, and its next claim would lose a transaction to learn it)."""
        if self.known is None:
            return
        self.known.remember_view(self.key, self.view if self.view.parked_at is None else None)


def _not_online() -> Conflict:
    """The refusal of a node that fails the claim transaction's liveness test (``ClaimView.online``)."""
    return Conflict(
        "node_not_online",
        "work goes only to online nodes: send a heartbeat, then claim (the node's last heartbeat is too old)",
    )


def _candidates(stores: Stores, capabilities: list[str]) -> list[WorkItem]:
    """The front of each capability's queue (``CLAIM_CANDIDATES`` items at most, one Query each
    while work is queued), in random order: concurrent claimers that read one front spread over
    it, and a node serving several capabilities takes from each alike."""
    queued = [item for capability in capabilities for item in stores.work.queue_front(capability, CLAIM_CANDIDATES)]
    random.shuffle(queued)
    return queued


def _claim_answer(stores: Stores, item: WorkItem) -> Claim:
    seconds = item.lease_seconds + URL_SLACK_SECONDS
    return Claim(
        item=item,
        input_url=stores.objects.presigned_get(item.input_key, seconds),
        result_upload_url=stores.objects.presigned_put(result_key(item.work_id, item.epoch), seconds),
    )


def _held(stores: Stores, caller: NodeCaller, work_id: str, epoch: int) -> WorkItem:
    """The item, if the caller holds its lease at ``epoch``; else a 409 saying why."""
    item = get(stores, work_id)
    if item.status == CANCELLED:
        raise Conflict("work_cancelled", "the work was cancelled: stop and upload nothing")
    if item.status in protocol.FINAL_STATES:
        raise Conflict("work_finished", _FINISHED[item.status])
    if item.status != LEASED or item.node_id != caller.node_id or item.epoch != epoch:
        raise Conflict("lease_lost", "this node no longer holds the lease at this epoch: stop and upload nothing")
    return item


def _write_held(
    stores: Stores, caller: NodeCaller, item: WorkItem, epoch: int, write: Callable[[Holder], WorkItem]
) -> WorkItem:
    """``write`` as the lease holder at ``epoch``; a failed guard says why (401 or 409)."""
    try:
        return write(Holder(caller.node_id, caller.credential_sha256))
    except GuardFailed:
        require_holder(stores.nodes.get(caller.node_id), caller)  # revoked meanwhile: 401
        _held(stores, caller, item.work_id, epoch)  # says why (cancelled, re-queued, re-claimed)
        raise Conflict("lease_lost", "the lease changed concurrently: stop and upload nothing") from None


def renew(
    stores: Stores,
    caller: NodeCaller,
    work_id: str,
    request: requests.RenewWork,
    now: float,
    known: KnownCallers | None,
) -> WorkItem:
    authenticate(stores, caller, known)
    item = _held(stores, caller, work_id, request.epoch)
    event = Event("work.lease_renewed", {"work_id": work_id, "epoch": str(item.epoch)}, now)
    until = now + item.lease_seconds
    return _write_held(
        stores, caller, item, request.epoch, lambda holder: stores.work.renew(item, holder, until, now, event)
    )


def complete(
    stores: Stores,
    caller: NodeCaller,
    work_id: str,
    request: requests.CompleteWork,
    now: float,
    known: KnownCallers | None,
) -> WorkItem:
    authenticate(stores, caller, known)
    epoch = request.epoch
    item = _held(stores, caller, work_id, epoch)
    upload = result_key(work_id, epoch)
    _check_result(stores.objects.digest(upload, protocol.MAX_RESULT_BYTES), request)
    # the copy is checked again: the upload may have been replaced between the check and the copy
    key = sealed_key(work_id, epoch)
    if not stores.objects.copy(upload, key):
        raise Conflict("result_missing", "no result was uploaded for this epoch: PUT it to result_upload_url first")
    _check_result(stores.objects.digest(key, protocol.MAX_RESULT_BYTES), request)
    result = {"sha256": request.sha256, "size": request.size, "key": key}
    event = Event("work.succeeded", {"work_id": work_id, "node_id": caller.node_id, "epoch": str(epoch)}, now)
    return _write_held(
        stores, caller, item, epoch, lambda holder: stores.work.complete(item, holder, result, now, event)
    )


def _check_result(found: tuple[str | None, int] | None, request: requests.CompleteWork) -> None:
    if found is None:
        raise Conflict("result_missing", "no result was uploaded for this epoch: PUT it to result_upload_url first")
    sha256, size = found
    if sha256 is None:
        raise TooLarge("result_too_large", f"the result is larger than {protocol.MAX_RESULT_BYTES} bytes")
    if sha256 != request.sha256 or size != request.size:
        raise Conflict("result_checksum_mismatch", "the uploaded result does not have the sha256 and size given")


def fail(
    stores: Stores, caller: NodeCaller, work_id: str, request: requests.FailWork, now: float, known: KnownCallers | None
) -> WorkItem:
    authenticate(stores, caller, known)
    epoch = request.epoch
    item = _held(stores, caller, work_id, epoch)
    ended = _write_held(
        stores,
        caller,
        item,
        epoch,
        lambda holder: _end_attempt(
            stores,
            item,
            LeaseCheck.of(holder),
            request.reason,
            request.retryable,
            now,
            cause="agent",
            node_fault=request.node_fault,
        ),
    )
    if ended.status == QUEUED:  # back in the queue: as claimable as a new submit
        dispatch.wake(stores, ended.capability, now)
    return ended


def _end_attempt(
    stores: Stores,
    item: WorkItem,
    check: LeaseCheck,
    reason: str,
    retryable: bool,
    now: float,
    cause: str,
    node_fault: bool = False,
) -> WorkItem:
    """Back to the queue while attempts remain and the failure is retryable; else dead. Every
    reason is kept. A node fault (the node failed, not the item) goes back without counting the
    attempt, up to ``MAX_NODE_FAULTS`` times an item: after that it counts, so a faulty node cannot
    keep an item in play, or its errors growing, forever."""
    faults = sum(1 for error in item.errors or [] if error.get("node_fault"))
    uncounted = node_fault and faults < MAX_NODE_FAULTS
    error = {
        "attempt": item.attempts,
        "epoch": item.epoch,
        "node_id": item.node_id,
        "reason": reason[: protocol.MAX_REASON_CHARS],
        "retryable": retryable or node_fault,
        "at": round(now, 3),
    }
    if node_fault:
        error["node_fault"] = True
    again = uncounted or ((retryable or node_fault) and item.attempts < item.max_attempts)
    subject = {"work_id": item.work_id, "epoch": str(item.epoch), "to": QUEUED if again else DEAD, "cause": cause}
    if again:
        event = Event("work.requeued", subject, now)
        return stores.work.requeue(item, check, error, now, event, counted=not uncounted)
    return stores.work.bury(item, check, error, now, Event("work.dead", subject, now))


# --- the sweep ----------------------------------------------------------------------------


def release_expired(stores: Stores, now: float) -> int:
    """Take back leases that expired: each item is re-queued (or dead), fenced by its epoch."""
    released = 0
    for item in stores.work.expired_leases(now, EXPIRED_PER_SWEEP):
        check = LeaseCheck(expired_by=now)
        released += _release(stores, item, check, "lease_expired: the holder stopped renewing", now, "lease_expired")
    return released


def release_node(stores: Stores, node_id: str, now: float) -> int:
    """A node the sweep marked offline loses its leases at once."""
    released = 0
    for item in stores.work.leases_held_by(node_id):
        check = LeaseCheck(node_id=node_id)
        released += _release(stores, item, check, "node_offline: the holder went offline", now, "node_offline")
    return released


def _release(stores: Stores, item: WorkItem, check: LeaseCheck, reason: str, now: float, cause: str) -> int:
    try:
        _end_attempt(stores, item, check, reason, True, now, cause=cause)
    except GuardFailed:
        return 0  # renewed, completed or failed meanwhile: the holder moved first
    return 1
