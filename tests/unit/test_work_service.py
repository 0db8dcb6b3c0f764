"""work: submitting, claiming, renewing, completing, failing and cancelling work, and the sweep's
lease expiry, decided against the in-memory stores (each store guard as DynamoDB checks it).

Every change, lease renewals included, is one guarded write with exactly one state-log event; a
write whose guard fails changes nothing."""

from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Conflict, DomainError, GuardFailed, Invalid, NotFound, TooLarge, Unauthenticated
from chalicelib.domain.records import Event, WorkItem
from chalicelib.services import known_callers, queue_fronts, work
from chalicelib.services.known_callers import KnownCallers
from chalicelib.services.queue_fronts import QueueFronts
from chalicelib.stores.contract import Holder, LeaseCheck, ObjectStore, Stores, WorkStore
from modelforge_protocol import work as protocol
from modelforge_protocol.canonical import canonical_bytes

from tests.support.journal import MemoryObjectStore
from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW, SETTINGS, Agent, node_record

OCR, ECHO = protocol.OCR, protocol.ECHO
CAPABILITIES = {OCR, ECHO}
#: The smallest inputs the control plane accepts as images: it checks base64 and the magic bytes.
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(13)
JPEG = b"\xff\xd8\xff\xe0" + bytes(16)
GIF = b"GIF89a" + bytes(16)
RESULT = b'{"text":"hello"}'
LEASE = protocol.DEFAULT_LEASE_SECONDS
SLACK = work.URL_SLACK_SECONDS


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


@pytest.fixture(autouse=True)
def oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the oldest, a claim tries the rest of its window in random order; these tests fix the
    order (the window's own order: oldest first) so each names the item it expects. The random
    spread has tests of its own, which undo this."""
    monkeypatch.setattr(work.random, "shuffle", lambda items: None)


# --- helpers --------------------------------------------------------------------------------------


def _node(stores: MemoryStores, capabilities: set[str] | None = None, **values: Any) -> Agent:
    """An online node serving ``capabilities`` (both work capabilities unless given), with a
    recent heartbeat (NOW - 5)."""
    agent = Agent()
    stores.nodes.seed(node_record(agent, capabilities=CAPABILITIES if capabilities is None else capabilities, **values))
    return agent


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _body(capability: str = ECHO, document: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    if document is None:
        document = {"image_base64": _b64(PNG)} if capability == OCR else {"text": "hi"}
    return {"capability": capability, "input": document, **fields}


def _submit(stores: MemoryStores, capability: str = ECHO, now: float = NOW - 10, **fields: Any) -> WorkItem:
    return work.submit(stores, typed.submit_work(_body(capability, **fields)), now).item


def _claim(stores: MemoryStores, agent: Agent, now: float = NOW) -> work.Claim:
    claimed = work.claim(stores, SETTINGS, agent.caller, now)
    assert claimed is not None
    return claimed


def _leased(stores: MemoryStores, agent: Agent | None = None, **fields: Any) -> tuple[Agent, WorkItem]:
    """A holder and the item it leased at NOW (epoch 1)."""
    agent = agent or _node(stores)
    item = _submit(stores, **fields)
    claimed = _claim(stores, agent)
    assert claimed.item.work_id == item.work_id
    return agent, claimed.item


def _stored(stores: MemoryStores, work_id: str) -> WorkItem:
    return stores.work.records[work_id]


def _upload(stores: MemoryStores, item: WorkItem, body: bytes = RESULT, epoch: int | None = None) -> dict[str, Any]:
    """The agent's PUT of ``body`` to the claim's result URL; the complete body that names it."""
    epoch = item.epoch if epoch is None else epoch
    stores.objects.upload(work.result_key(item.work_id, epoch), body)
    return {"epoch": epoch, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}


def _known(agent: Agent) -> KnownCallers:
    known = KnownCallers()
    known.remember((agent.node_id, agent.credential_sha256))
    return known


def _state(stores: MemoryStores) -> dict[str, Any]:
    return copy.deepcopy(
        {
            "work": stores.work.records,
            "nodes": stores.nodes.records,
            "objects": stores.objects.objects,
            "events": stores.journal.events,
            "writes": stores.journal.writes,
        }
    )


def _refused(stores: MemoryStores, action: Callable[[], object], error: type[DomainError], code: str) -> DomainError:
    """``action`` raises ``error`` with ``code`` and changes nothing."""
    before = _state(stores)
    with pytest.raises(error) as raised:
        action()
    assert raised.value.code == code
    assert _state(stores) == before
    return raised.value


def _events(stores: MemoryStores) -> list[tuple[str, dict[str, str]]]:
    return [(event.type, event.subject) for event in stores.journal.events]


# --- the fakes ------------------------------------------------------------------------------------


def test_the_work_fakes_are_the_protocols(stores: MemoryStores) -> None:
    assert isinstance(stores, Stores)
    store: WorkStore = stores.work
    objects: ObjectStore = stores.objects
    assert store.get("work_" + "0" * 32) is None and objects.digest("nothing", 10) is None


def test_the_fake_lease_names_every_part_that_failed(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores)
    event = Event("test.event", {"work_id": item.work_id}, NOW)

    def lease(epoch: int, credential: str = agent.credential_sha256, heartbeat_after: float = NOW - 60) -> WorkItem:
        read = dataclasses.replace(item, epoch=epoch)
        return stores.work.lease(read, Holder(agent.node_id, credential), heartbeat_after, NOW + LEASE, NOW, event)

    before = _state(stores)
    for attempt, failed in [
        (lambda: lease(1), ("work",)),
        (lambda: lease(0, credential="f" * 64), ("node",)),
        (lambda: lease(0, heartbeat_after=NOW - 5), ("node",)),  # not after: equal
        (lambda: lease(1, heartbeat_after=NOW), ("work", "node")),
    ]:
        with pytest.raises(GuardFailed) as raised:
            attempt()
        assert raised.value.failed == failed
        assert _state(stores) == before
    leased = lease(0)
    assert leased == _stored(stores, item.work_id) and stores.journal.events[-1] == event
    assert (leased.status, leased.epoch, leased.attempts, leased.node_id) == ("leased", 1, 1, agent.node_id)
    assert (leased.lease_expires_at, leased.queued_at, leased.updated_at) == (NOW + LEASE, None, NOW)


def test_the_fake_lease_writes_check_every_part_of_the_guard(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    before = _state(stores)
    expires = item.lease_expires_at
    assert expires is not None
    event = Event("test.event", {"work_id": item.work_id}, NOW)
    error = {"reason": "x"}
    for read, check in [
        (dataclasses.replace(item, epoch=2), LeaseCheck()),
        (item, LeaseCheck(node_id="node_other")),
        (item, LeaseCheck(expired_by=expires - 1)),
        (item, LeaseCheck(node_id=agent.node_id, credential_sha256="f" * 64)),
        (dataclasses.replace(item, work_id="work_" + "0" * 32), LeaseCheck()),  # no such item
    ]:
        with pytest.raises(GuardFailed):
            stores.work.requeue(read, check, error, NOW + 1, event)
        assert _state(stores) == before
    check = LeaseCheck(node_id=agent.node_id, credential_sha256=agent.credential_sha256, expired_by=expires)
    written = stores.work.requeue(item, check, error, NOW + 1, event)
    assert written == _stored(stores, item.work_id) and written.errors == [error]
    assert (written.status, written.queued_at, written.lease_expires_at) == ("queued", NOW + 1, None)
    assert stores.journal.writes == before["writes"] + 1 and stores.journal.events == [*before["events"], event]


def test_the_fake_lease_expiry_guard_fails_on_an_item_not_leased(stores: MemoryStores) -> None:
    item = _submit(stores)
    with pytest.raises(GuardFailed):
        event = Event("test.event", {"work_id": item.work_id}, NOW)
        stores.work.bury(item, LeaseCheck(expired_by=NOW + 10**6), {"reason": "x"}, NOW, event)


def test_the_fake_lists_work_by_id_with_filters_and_paging_keys(stores: MemoryStores) -> None:
    items = sorted((_submit(stores, capability=OCR if n % 2 else ECHO) for n in range(5)), key=lambda i: i.work_id)
    first, key = stores.work.list_page(2, None, None, None)
    second, key2 = stores.work.list_page(2, key, None, None)
    last, key3 = stores.work.list_page(2, key2, None, None)
    assert [i.work_id for i in first + second + last] == [i.work_id for i in items]
    assert key == {"work_id": {"S": items[1].work_id}} and key3 is None
    ocr = [i.work_id for i in items if i.capability == OCR]
    page, more = stores.work.list_page(10, None, "queued", OCR)
    assert [i.work_id for i in page] == ocr and more is None
    assert stores.work.list_page(10, None, "leased", None) == ([], None)


def test_the_fake_object_store_digests_and_presigns(stores: MemoryStores) -> None:
    stores.objects.put("a/b.json", b"{}", "application/json")
    assert stores.objects.digest("a/b.json", 2) == (hashlib.sha256(b"{}").hexdigest(), 2)
    assert stores.objects.digest("a/b.json", 1) == (None, 2)
    assert stores.objects.digest("a/c.json", 2) is None
    assert stores.objects.presigned_get("a/b.json", 7) == f"{MemoryObjectStore.URL_BASE}/get/a/b.json?expires=7"
    assert stores.objects.presigned_put("a/c.json", 9) == f"{MemoryObjectStore.URL_BASE}/put/a/c.json?expires=9"
    assert (stores.journal.reads, stores.journal.writes) == (0, 0)


# --- submit ---------------------------------------------------------------------------------------


def test_submit_queues_an_item_with_the_defaults_and_stores_its_input_canonically(stores: MemoryStores) -> None:
    submitted = work.submit(stores, typed.submit_work(_body(ECHO, {"b": [1, 2], "a": "é"})), NOW)
    item = submitted.item
    assert submitted.created and item == _stored(stores, item.work_id)
    assert work._WORK_ID.fullmatch(item.work_id)
    assert (item.capability, item.status, item.attempts, item.epoch) == (ECHO, "queued", 0, 0)
    assert (item.max_attempts, item.lease_seconds) == (3, 60)
    assert (item.created_at, item.updated_at, item.queued_at, item.capability) == (NOW, NOW, NOW, ECHO)
    assert (item.lease_expires_at, item.node_id) == (None, None)
    assert item.idempotency_key_sha256 is None and item.errors is None and item.result is None
    document = json.dumps({"a": "é", "b": [1, 2]}, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert item.input_key == work.input_key(item.work_id, hashlib.sha256(document).hexdigest())
    assert stores.objects.objects[item.input_key] == (document, "application/json")
    assert (item.input_sha256, item.input_size) == (hashlib.sha256(document).hexdigest(), len(document))
    assert _events(stores) == [("work.submitted", {"work_id": item.work_id, "capability": ECHO})]
    assert stores.journal.writes == 1


def test_submit_keeps_the_attempts_and_lease_asked_for(stores: MemoryStores) -> None:
    item = _submit(stores, max_attempts=10, lease_seconds=3600)
    assert (item.max_attempts, item.lease_seconds) == (10, 3600)
    item = _submit(stores, max_attempts=1, lease_seconds=10)
    assert (item.max_attempts, item.lease_seconds) == (1, 10)


def test_submits_without_a_key_make_distinct_items(stores: MemoryStores) -> None:
    first, second = _submit(stores), _submit(stores)
    assert first.work_id != second.work_id and len(stores.work.records) == 2


@pytest.mark.parametrize(
    "body",
    [
        _body(max_attempts=0),
        _body(max_attempts=11),
        _body(lease_seconds=9),
        _body(lease_seconds=3601),
        _body(max_attempts="3"),
        _body(idempotency_key="short"),
        _body(idempotency_key="has space in it"),
        _body(idempotency_key="k" * 129),
        _body("gpu.magic"),
        _body(ECHO, {f"k{n}": n for n in range(65)}),
        _body(OCR, {}),
        _body(OCR, {"image_base64": ""}),
        _body(OCR, {"image_base64": _b64(PNG), "extra": 1}),
        _body(OCR, {"image_base64": _b64(PNG), "detect_rotation": "true"}),
        _body(OCR, {"image_base64": _b64(PNG), "detect_rotation": 1}),
        _body(OCR, {"image_base64": _b64(PNG), "detect_rotation": None}),
        {"capability": ECHO},
        {"input": {}},
        {**_body(), "priority": 1},
        {**_body(), "input": []},
    ],
    ids=[
        "attempts-0",
        "attempts-11",
        "lease-9",
        "lease-3601",
        "attempts-string",
        "key-short",
        "key-space",
        "key-long",
        "unknown-capability",
        "echo-too-many-fields",
        "ocr-no-image",
        "ocr-empty-image",
        "ocr-extra-field",
        "ocr-detect-rotation-string",
        "ocr-detect-rotation-number",
        "ocr-detect-rotation-null",
        "no-input",
        "no-capability",
        "unknown-field",
        "input-not-object",
    ],
)
def test_an_invalid_submission_writes_nothing(stores: MemoryStores, body: dict[str, Any]) -> None:
    _refused(stores, lambda: work.submit(stores, typed.submit_work(body), NOW), Invalid, "invalid_request")
    assert stores.objects.objects == {} and stores.journal.calls == []


@pytest.mark.parametrize("detect_rotation", [True, False])
def test_an_ocr_input_may_ask_for_rotation_detection(stores: MemoryStores, detect_rotation: bool) -> None:
    document = {"image_base64": _b64(PNG), "detect_rotation": detect_rotation}
    item = work.submit(stores, typed.submit_work(_body(OCR, document)), NOW).item
    assert json.loads(stores.objects.body(item.input_key)) == document


@pytest.mark.parametrize("image", [PNG, JPEG], ids=["png", "jpeg"])
def test_an_ocr_image_is_accepted_as_png_or_jpeg(stores: MemoryStores, image: bytes) -> None:
    item = work.submit(stores, typed.submit_work(_body(OCR, {"image_base64": _b64(image)})), NOW).item
    assert item.capability == OCR and item.queued_at is not None
    assert json.loads(stores.objects.body(item.input_key)) == {"image_base64": _b64(image)}


@pytest.mark.parametrize(
    "image_base64",
    ["not base64!", _b64(PNG)[:-1], _b64(PNG) + "\n", _b64(GIF), _b64(b"\x89PNG"), _b64(b"plain text")],
    ids=["not-base64", "bad-padding", "newline", "gif", "truncated-png-signature", "text"],
)
def test_an_ocr_input_that_is_not_a_png_or_jpeg_is_invalid_input(stores: MemoryStores, image_base64: str) -> None:
    _refused(
        stores,
        lambda: work.submit(stores, typed.submit_work(_body(OCR, {"image_base64": image_base64})), NOW),
        Invalid,
        "invalid_input",
    )
    assert stores.objects.objects == {}


def test_an_idempotent_retry_returns_the_same_item_and_writes_nothing(stores: MemoryStores) -> None:
    first = work.submit(stores, typed.submit_work(_body(ECHO, {"a": 1, "b": 2}, idempotency_key="job-0001")), NOW)
    assert first.created and first.item.idempotency_key_sha256 == hashlib.sha256(b"job-0001").hexdigest()
    assert first.item.work_id == "work_" + hashlib.sha256(b"job-0001").hexdigest()[:32]
    stores.journal.reset_counts()
    # the same input in another key order is the same input
    again = work.submit(stores, typed.submit_work(_body(ECHO, {"b": 2, "a": 1}, idempotency_key="job-0001")), NOW + 30)
    assert not again.created and again.item == first.item
    assert stores.journal.calls == ["work.get"] and stores.journal.writes == 0
    assert len(stores.work.records) == 1


def test_an_idempotent_retry_of_claimed_work_returns_it_as_it_is_now(stores: MemoryStores) -> None:
    agent = _node(stores)
    work.submit(stores, typed.submit_work(_body(idempotency_key="job-0001")), NOW - 10)
    _claim(stores, agent)
    again = work.submit(stores, typed.submit_work(_body(idempotency_key="job-0001")), NOW)
    assert not again.created and again.item.status == "leased" and again.item.node_id == agent.node_id


@pytest.mark.parametrize(
    "retry",
    [
        _body(ECHO, {"image_base64": _b64(JPEG)}, idempotency_key="job-0001"),
        _body(OCR, {"image_base64": _b64(PNG)}, idempotency_key="job-0001"),
    ],
    ids=["other-input", "same-input-other-capability"],
)
def test_a_key_reused_for_different_work_is_a_conflict(stores: MemoryStores, retry: dict[str, Any]) -> None:
    work.submit(stores, typed.submit_work(_body(ECHO, {"image_base64": _b64(PNG)}, idempotency_key="job-0001")), NOW)
    _refused(stores, lambda: work.submit(stores, typed.submit_work(retry), NOW), Conflict, "idempotency_key_reused")


def test_a_concurrent_submit_with_the_same_key_makes_one_item(stores: MemoryStores) -> None:
    body = _body(idempotency_key="job-0001")
    stores.journal.before_next("work.create", lambda: work.submit(stores, typed.submit_work(body), NOW))
    submitted = work.submit(stores, typed.submit_work(body), NOW)
    assert not submitted.created and submitted.item == _stored(stores, submitted.item.work_id)
    assert len(stores.work.records) == 1 and stores.journal.event_types() == ["work.submitted"]


def test_a_concurrent_submit_with_the_same_key_and_other_input_is_a_conflict(stores: MemoryStores) -> None:
    stores.journal.before_next(
        "work.create",
        lambda: work.submit(stores, typed.submit_work(_body(ECHO, {"text": "first"}, idempotency_key="job-0001")), NOW),
    )
    with pytest.raises(Conflict) as raised:
        work.submit(stores, typed.submit_work(_body(ECHO, {"text": "second"}, idempotency_key="job-0001")), NOW)
    assert raised.value.code == "idempotency_key_reused"
    assert len(stores.work.records) == 1 and stores.journal.event_types() == ["work.submitted"]


def test_a_concurrent_submit_with_other_input_cannot_replace_the_winners_input(stores: MemoryStores) -> None:
    winner = _body(ECHO, {"text": "first"}, idempotency_key="job-0001")
    loser = _body(ECHO, {"text": "second"}, idempotency_key="job-0001")
    work_id = "work_" + hashlib.sha256(b"job-0001").hexdigest()[:32]

    def loser_puts_its_input() -> None:
        # the loser read no item yet and puts its input after the winner's put, before its create
        document = canonical_bytes(loser["input"])
        stores.objects.put(work.input_key(work_id, hashlib.sha256(document).hexdigest()), document, "application/json")

    stores.journal.before_next("work.create", loser_puts_its_input)
    item = work.submit(stores, typed.submit_work(winner), NOW).item
    with pytest.raises(Conflict):
        work.submit(stores, typed.submit_work(loser), NOW)  # its create fails: idempotency_key_reused
    # the agent downloads input_key and runs it: it must be the input the item was made with
    assert hashlib.sha256(stores.objects.body(item.input_key)).hexdigest() == item.input_sha256


# --- get ------------------------------------------------------------------------------------------


def test_get_returns_the_stored_item(stores: MemoryStores) -> None:
    item = _submit(stores)
    assert work.get(stores, item.work_id) == item


@pytest.mark.parametrize(
    "work_id",
    [
        "work_" + "0" * 32,
        "work_" + "A" * 32,
        "work_" + "0" * 31,
        "work_" + "0" * 33,
        "job_" + "0" * 32,
        "",
        "work_" + "0" * 32 + "\n",
    ],
    ids=["unknown", "upper-case", "short", "long", "other-prefix", "empty", "newline"],
)
def test_get_of_an_unknown_or_malformed_id_is_not_found(stores: MemoryStores, work_id: str) -> None:
    with pytest.raises(NotFound) as raised:
        work.get(stores, work_id)
    assert raised.value.code == "work_not_found"
    # only a well-formed id is looked up
    assert stores.journal.reads == (1 if work_id == "work_" + "0" * 32 else 0)


# --- cancel ---------------------------------------------------------------------------------------


def test_cancelling_queued_work_takes_it_off_the_queue(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores)
    stores.journal.reset_counts()
    cancelled = work.cancel(stores, item.work_id, NOW)
    assert cancelled == _stored(stores, item.work_id)
    assert (cancelled.status, cancelled.finished_at, cancelled.updated_at) == ("cancelled", NOW, NOW)
    assert cancelled.queued_at is None
    assert _events(stores) == [("work.cancelled", {"work_id": item.work_id, "from": "queued"})]
    assert stores.journal.writes == 1
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is None


def test_cancelling_leased_work_ends_the_lease_and_fences_the_holder(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    stores.journal.reset_counts()
    cancelled = work.cancel(stores, item.work_id, NOW + 1)
    assert cancelled.status == "cancelled" and cancelled.epoch == 1 and cancelled.node_id == agent.node_id
    assert cancelled.lease_expires_at is None
    assert _events(stores) == [("work.cancelled", {"work_id": item.work_id, "from": "leased"})]
    body = _upload(stores, item)
    for call in (
        lambda: work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 2, None),
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 2, None),
        lambda: work.fail(
            stores,
            agent.caller,
            item.work_id,
            typed.fail_work({"epoch": 1, "reason": "x", "retryable": True}),
            NOW + 2,
            None,
        ),
    ):
        _refused(stores, call, Conflict, "work_cancelled")
    assert work.release_expired(stores, NOW + 10 * LEASE) == 0 and work.release_node(stores, agent.node_id, NOW) == 0


@pytest.mark.parametrize("status", ["succeeded", "dead", "cancelled"])
def test_finished_work_cannot_be_cancelled(stores: MemoryStores, status: str) -> None:
    item = _submit(stores)
    _stored(stores, item.work_id).status = status
    _refused(stores, lambda: work.cancel(stores, item.work_id, NOW), Conflict, "work_finished")


def test_cancel_of_unknown_work_is_not_found(stores: MemoryStores) -> None:
    _refused(stores, lambda: work.cancel(stores, "work_" + "0" * 32, NOW), NotFound, "work_not_found")
    _refused(stores, lambda: work.cancel(stores, "nonsense", NOW), NotFound, "work_not_found")


def test_a_cancel_that_loses_to_a_claim_judges_again_and_cancels_the_lease(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores)
    stores.journal.before_next("work.cancel", lambda: work.claim(stores, SETTINGS, agent.caller, NOW))
    cancelled = work.cancel(stores, item.work_id, NOW + 1)
    assert cancelled.status == "cancelled" and cancelled.lease_expires_at is None and cancelled.epoch == 1
    assert stores.journal.event_types() == ["work.submitted", "work.leased", "work.cancelled"]
    assert stores.journal.events[-1].subject["from"] == "leased"


def test_a_cancel_that_loses_to_completion_is_work_finished(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item)
    stores.journal.before_next(
        "work.cancel",
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None),
    )
    with pytest.raises(Conflict) as raised:
        work.cancel(stores, item.work_id, NOW + 1)
    assert raised.value.code == "work_finished" and _stored(stores, item.work_id).status == "succeeded"
    assert stores.journal.event_types()[-1] == "work.succeeded"


def test_a_cancel_that_keeps_losing_gives_up_with_work_conflict(stores: MemoryStores) -> None:
    item = _submit(stores)

    def someone_moves_first() -> None:
        stores.work.records[item.work_id].epoch += 1

    stores.journal.before_next("work.cancel", someone_moves_first, times=work.CLAIM_ROUNDS)
    writes = stores.journal.writes
    with pytest.raises(Conflict) as raised:
        work.cancel(stores, item.work_id, NOW)
    assert raised.value.code == "work_conflict"
    assert stores.journal.calls.count("work.cancel") == work.CLAIM_ROUNDS
    assert stores.journal.writes == writes and _stored(stores, item.work_id).status == "queued"


# --- claim ----------------------------------------------------------------------------------------


def test_a_claim_leases_the_item_to_the_node_with_presigned_urls(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores, lease_seconds=120)
    stores.journal.reset_counts()
    claimed = _claim(stores, agent, NOW)
    leased = claimed.item
    assert leased == _stored(stores, item.work_id)
    assert (leased.status, leased.epoch, leased.attempts) == ("leased", 1, 1)
    assert leased.node_id == agent.node_id
    assert (leased.lease_expires_at, leased.updated_at) == (NOW + 120, NOW)
    assert leased.queued_at is None
    base = MemoryObjectStore.URL_BASE
    assert claimed.input_url == f"{base}/get/{item.input_key}?expires={120 + SLACK}"
    assert claimed.result_upload_url == f"{base}/put/{work.result_key(item.work_id, 1)}?expires={120 + SLACK}"
    assert _events(stores) == [("work.leased", {"work_id": item.work_id, "node_id": agent.node_id, "epoch": "1"})]
    assert stores.journal.writes == 1


def test_a_claim_takes_items_of_every_capability_the_node_serves(stores: MemoryStores) -> None:
    agent = _node(stores)
    items = [
        _submit(stores, ECHO, now=NOW - 10),
        _submit(stores, OCR, now=NOW - 30),
        _submit(stores, ECHO, now=NOW - 20),
    ]
    claimed = [_claim(stores, agent).item.work_id for _ in range(3)]
    assert sorted(claimed) == sorted(item.work_id for item in items)
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is None


def test_claims_go_oldest_first_within_the_window(stores: MemoryStores) -> None:
    agent = _node(stores)
    items = [_submit(stores, now=NOW - 100 + n) for n in range(4)]
    for expected in items:
        # the window is the oldest items by queue time (tried in that order with the shuffle fixed)
        assert _claim(stores, agent).item.work_id == expected.work_id


def test_a_claim_reads_only_the_front_of_the_queue(stores: MemoryStores, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the real shuffle a claim takes any item of the queue's front, never one behind it."""
    monkeypatch.undo()
    agent = _node(stores)
    items = [_submit(stores, now=NOW - 1000 + n) for n in range(work.CLAIM_CANDIDATES + 10)]
    front = {item.work_id for item in items[: work.CLAIM_CANDIDATES]}
    assert _claim(stores, agent).item.work_id in front


def test_concurrent_claimers_spread_over_the_queue_front(stores: MemoryStores, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claimers that read the same front try its items in random order, not all the oldest first,
    so that few of them race for one item."""
    monkeypatch.undo()
    import random as random_module

    random_module.seed(11)
    items = [_submit(stores, now=NOW - 100 + n) for n in range(work.CLAIM_CANDIDATES + 5)]
    windows = [work._candidates(stores, sorted(CAPABILITIES)) for _ in range(10)]
    front = {i.work_id for i in items[: work.CLAIM_CANDIDATES]}
    assert all({i.work_id for i in window} == front for window in windows)
    assert len({window[0].work_id for window in windows}) >= 6


def test_a_claim_reads_the_queue_again_after_a_lost_try(stores: MemoryStores) -> None:
    """A front that loses a try is going stale: the claim reads the queue again rather than spend
    another transaction on it."""
    agent = _node(stores, {ECHO})
    items = [_submit(stores, now=NOW - 100 + n) for n in range(5)]

    def someone_takes_the_first_two() -> None:
        for item in items[:2]:
            stores.work.records[item.work_id].epoch += 1  # taken and put back: the read is stale

    stores.journal.before_next("work.lease", someone_takes_the_first_two)
    stores.journal.reset_counts()
    claimed = _claim(stores, agent)
    assert claimed.item.work_id == items[0].work_id  # the second read saw its new epoch
    assert stores.journal.calls.count("work.queue_front") == 2
    assert stores.journal.calls.count("work.lease") == 2


# --- the queue front an instance remembers (queue_fronts.py) -------------------------------------


def _claim_remembering(stores: MemoryStores, agent: Agent, fronts: QueueFronts, now: float = NOW) -> WorkItem | None:
    claimed = work.claim(stores, SETTINGS, agent.caller, now, KnownCallers(), fronts)
    return None if claimed is None else claimed.item


def test_claims_of_one_instance_read_the_front_once_and_take_each_item_once(stores: MemoryStores) -> None:
    """A read of CLAIM_CANDIDATES items serves that many claims, of any node of the capability:
    one Query, each item leased once, and the next claim reads the queue again."""
    agents = [_node(stores, {ECHO}) for _ in range(3)]
    items = [_submit(stores, now=NOW - 100 + n) for n in range(work.CLAIM_CANDIDATES + 3)]
    fronts = QueueFronts()
    stores.journal.reset_counts()
    taken = [_claim_remembering(stores, agents[n % 3], fronts) for n in range(work.CLAIM_CANDIDATES)]
    assert stores.journal.calls.count("work.queue_front") == 1
    assert stores.journal.calls.count("work.lease") == work.CLAIM_CANDIDATES  # no lost try
    assert sorted(item.work_id for item in taken if item) == sorted(i.work_id for i in items[: work.CLAIM_CANDIDATES])
    assert fronts.remembered(ECHO) == 0
    assert _claim_remembering(stores, agents[0], fronts) is not None
    assert stores.journal.calls.count("work.queue_front") == 2


def test_a_remembered_item_taken_elsewhere_costs_one_lost_try_then_a_fresh_read(stores: MemoryStores) -> None:
    """Another instance leased or cancelled every item of the front this instance remembers: the
    lease fails on the item's epoch, the front is forgotten, and the claim reads the queue again."""
    agent, other = _node(stores, {ECHO}), _node(stores, {ECHO})
    items = [_submit(stores, now=NOW - 100 + n) for n in range(6)]
    fronts = QueueFronts()
    assert _claim_remembering(stores, agent, fronts) is not None
    assert fronts.remembered(ECHO) == 5
    later = _submit(stores, now=NOW - 5)  # not in the remembered front
    for _ in items[1:4]:
        assert work.claim(stores, SETTINGS, other.caller, NOW) is not None  # another instance: no memory
    for item in items[4:]:
        work.cancel(stores, item.work_id, NOW)
    stores.journal.reset_counts()
    claimed = _claim_remembering(stores, agent, fronts)
    assert claimed is not None and claimed.work_id == later.work_id
    assert stores.journal.calls.count("work.lease") == 2 and stores.journal.calls.count("work.queue_front") == 1
    assert fronts.remembered(ECHO) == 0
    # the queue is empty now: judged on a fresh read, never from memory
    assert _claim_remembering(stores, agent, fronts) is None
    assert stores.journal.calls.count("work.queue_front") == 2 and stores.journal.calls.count("work.lease") == 2


def test_a_lost_try_on_a_remembered_item_forgets_the_front(stores: MemoryStores) -> None:
    agent = _node(stores, {ECHO})
    items = [_submit(stores, now=NOW - 100 + n) for n in range(4)]
    fronts = QueueFronts()
    assert _claim_remembering(stores, agent, fronts) is not None
    for item in items[1:]:
        stores.work.records[item.work_id].epoch += 1  # taken and put back elsewhere: the memory is stale
    stores.journal.reset_counts()
    claimed = _claim_remembering(stores, agent, fronts)
    assert claimed is not None and claimed.epoch == items[1].epoch + 2  # leased at its true epoch
    assert stores.journal.calls.count("work.lease") == 2 and stores.journal.calls.count("work.queue_front") == 1
    # others are taking from that front: for the cool-off every claim reads, as without the memory
    assert fronts.remembered(ECHO) == 0
    assert _claim_remembering(stores, agent, fronts, NOW + 1) is not None
    assert stores.journal.calls.count("work.queue_front") == 2 and fronts.remembered(ECHO) == 0
    for n in range(3):
        _submit(stores, now=NOW - 50 + n)
    assert _claim_remembering(stores, agent, fronts, NOW + queue_fronts.COOL_OFF_SECONDS) is not None
    assert fronts.remembered(ECHO) == 3  # after the cool-off: 4 queued, one leased, the rest remembered


def test_a_lost_try_on_an_item_just_read_also_cools_the_memory_off(stores: MemoryStores) -> None:
    """Any lost lease says others are taking from those fronts: the claim's fresh read after it is
    not remembered either."""
    agent = _node(stores, {ECHO})
    items = [_submit(stores, now=NOW - 100 + n) for n in range(5)]
    fronts = QueueFronts()

    def someone_takes_the_first() -> None:
        stores.work.records[items[0].work_id].epoch += 1  # taken and put back: the read is stale

    stores.journal.before_next("work.lease", someone_takes_the_first)
    stores.journal.reset_counts()
    assert _claim_remembering(stores, agent, fronts) is not None
    assert stores.journal.calls.count("work.lease") == 2 and stores.journal.calls.count("work.queue_front") == 2
    assert fronts.remembered(ECHO) == 0


def test_a_remembered_front_expires(stores: MemoryStores) -> None:
    agent = _node(stores, {ECHO})
    for n in range(4):
        _submit(stores, now=NOW - 100 + n)
    fronts = QueueFronts()
    assert _claim_remembering(stores, agent, fronts) is not None
    stores.journal.reset_counts()
    assert _claim_remembering(stores, agent, fronts, NOW + queue_fronts.FRONT_SECONDS) is not None
    assert stores.journal.calls.count("work.queue_front") == 0
    assert _claim_remembering(stores, agent, fronts, NOW + queue_fronts.FRONT_SECONDS + 0.01) is not None
    assert stores.journal.calls.count("work.queue_front") == 1


def test_a_node_of_several_capabilities_reads_every_queue_unless_it_remembers_each(stores: MemoryStores) -> None:
    """Memory of one queue does not starve another: a node serving ECHO and OCR whose instance
    remembers only ECHO's front reads both, and takes from each alike."""
    echo_only, both = _node(stores, {ECHO}), _node(stores, CAPABILITIES)
    for n in range(3):
        _submit(stores, now=NOW - 100 + n)
    ocr = _submit(stores, OCR, now=NOW - 50)
    fronts = QueueFronts()
    assert _claim_remembering(stores, echo_only, fronts) is not None
    assert fronts.remembered(ECHO) == 2 and fronts.remembered(OCR) == 0
    stores.journal.reset_counts()
    assert _claim_remembering(stores, both, fronts) is not None
    assert stores.journal.calls.count("work.queue_front") == 2  # both queues read
    # read: the 2 echo items left and the ocr one; one leased, the other two remembered
    assert fronts.remembered(ECHO) + fronts.remembered(OCR) == 2 and fronts.remembered(OCR) <= 1
    assert _claim_remembering(stores, both, fronts) is not None
    assert stores.journal.calls.count("work.queue_front") == 2  # from memory: both queues remembered
    while _claim_remembering(stores, both, fronts) is not None:
        pass
    assert stores.work.records[ocr.work_id].status == "leased"
    assert {item.status for item in stores.work.records.values()} == {"leased"}


def test_a_remembering_claim_of_an_empty_queue_parks_on_a_fresh_read(stores: MemoryStores) -> None:
    """Emptiness is never taken from memory: every remembered item gone, the claim reads the queue,
    finds it empty, parks the node and reads once more (no lost wake-up)."""
    agent = _node(stores, {ECHO}, channel_connection_id="conn-1=", channel_connected_at=NOW)
    stores.channel.open("conn-1=")
    items = [_submit(stores, now=NOW - 100 + n) for n in range(3)]
    fronts = QueueFronts()
    assert _claim_remembering(stores, agent, fronts) is not None
    for item in items[1:]:
        work.cancel(stores, item.work_id, NOW)
    stores.journal.reset_counts()
    assert _claim_remembering(stores, agent, fronts) is None
    assert stores.nodes.records[agent.node_id].parked_at == NOW
    assert stores.journal.calls.count("work.queue_front") == 2  # check, park, re-check


def test_a_claim_serves_only_the_work_capabilities_the_node_lists(stores: MemoryStores) -> None:
    ocr_only = _node(stores, {OCR})
    echo = _submit(stores, ECHO)
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, ocr_only.caller, NOW) is None
    assert stores.journal.calls == ["nodes.get", "work.queue_front"] and stores.journal.writes == 0
    runtime = _node(stores, {"cpu", "cuda", ECHO})
    stores.journal.reset_counts()
    assert _claim(stores, runtime).item.work_id == echo.work_id
    # "cpu" and "cuda" are not work capabilities: never queried
    assert stores.journal.calls.count("work.queue_front") == 1


@pytest.mark.parametrize("capabilities", [None, {"cpu", "cuda"}], ids=["none", "no-work-capability"])
def test_a_node_without_work_capabilities_claims_nothing_and_reads_no_queue(
    stores: MemoryStores, capabilities: set[str] | None
) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, capabilities=capabilities))
    _submit(stores, ECHO)
    _submit(stores, OCR)
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is None
    assert stores.journal.calls == ["nodes.get"]


def test_a_claim_with_nothing_queued_is_none_and_writes_nothing(stores: MemoryStores) -> None:
    agent = _node(stores)
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is None
    assert stores.journal.writes == 0 and stores.journal.events == []


@pytest.mark.parametrize(
    "values",
    [
        {"last_heartbeat_at": NOW - SETTINGS.stale_after_seconds},  # exactly stale: not after the cutoff
        {"last_heartbeat_at": NOW - 1000},
        {"last_heartbeat_at": None},
        {"state": "stale", "last_heartbeat_at": NOW - 5},
        {"state": "offline", "last_heartbeat_at": NOW - 5},
        {"state": "pending", "last_heartbeat_at": None},
    ],
    ids=["heartbeat-at-cutoff", "heartbeat-old", "no-heartbeat", "stale", "offline", "pending"],
)
def test_a_node_that_is_not_online_by_its_heartbeat_cannot_claim(stores: MemoryStores, values: dict[str, Any]) -> None:
    """Persisted liveness lags (the sweep runs every minute): the heartbeat's age decides."""
    agent = _node(stores, **values)
    _submit(stores)
    stores.journal.reset_counts()
    _refused(stores, lambda: work.claim(stores, SETTINGS, agent.caller, NOW), Conflict, "node_not_online")
    assert stores.journal.calls == ["nodes.get"]  # refused on the node read, before the queue is read


def test_a_node_whose_heartbeat_ages_out_during_the_claim_is_refused_by_the_write(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores)

    def heartbeat_ages() -> None:
        stores.nodes.records[agent.node_id].last_heartbeat_at = NOW - 1000

    stores.journal.before_next("work.lease", heartbeat_ages)
    with pytest.raises(Conflict) as raised:
        work.claim(stores, SETTINGS, agent.caller, NOW)
    assert raised.value.code == "node_not_online"
    assert _stored(stores, item.work_id).status == "queued" and stores.journal.event_types() == ["work.submitted"]
    # the write said the node's check failed: the node is read at once, and that read decides
    assert stores.journal.calls.count("work.lease") == 1 and stores.journal.calls.count("nodes.get") == 2


def test_a_node_marked_offline_during_the_claim_is_refused_by_the_write(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores)

    def sweep_marks_offline() -> None:
        stores.nodes.records[agent.node_id].liveness = "offline"

    stores.journal.before_next("work.lease", sweep_marks_offline)
    with pytest.raises(Conflict) as raised:
        work.claim(stores, SETTINGS, agent.caller, NOW)
    assert raised.value.code == "node_not_online" and _stored(stores, item.work_id).status == "queued"


def test_a_credential_revoked_during_the_claim_is_unauthenticated(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores)

    def admin_revokes() -> None:
        stores.nodes.records[agent.node_id].credential_state = "revoked"

    stores.journal.before_next("work.lease", admin_revokes)
    with pytest.raises(Unauthenticated) as raised:
        work.claim(stores, SETTINGS, agent.caller, NOW)
    assert raised.value.code == "credential_revoked" and _stored(stores, item.work_id).status == "queued"
    assert stores.journal.event_types() == ["work.submitted"]


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ("revoked", "credential_revoked"),
        ("wrong-credential", "credential_invalid"),
        ("unknown-node", "credential_invalid"),
    ],
)
def test_a_claim_needs_the_nodes_active_credential(stores: MemoryStores, setup: str, code: str) -> None:
    _submit(stores)
    if setup == "revoked":
        caller = _node(stores, credential_state="revoked").caller
    elif setup == "wrong-credential":
        caller = Agent(node_id=_node(stores).node_id).caller
    else:
        caller = Agent().caller
    _refused(stores, lambda: work.claim(stores, SETTINGS, caller, NOW), Unauthenticated, code)


def test_a_claim_that_loses_a_race_takes_the_next_candidate(stores: MemoryStores) -> None:
    agent, rival = _node(stores), _node(stores)
    first = _submit(stores, now=NOW - 20)
    second = _submit(stores, now=NOW - 10)
    stores.journal.before_next("work.lease", lambda: work.claim(stores, SETTINGS, rival.caller, NOW))
    claimed = _claim(stores, agent)
    assert claimed.item.work_id == second.work_id and claimed.item.node_id == agent.node_id
    assert _stored(stores, first.work_id).node_id == rival.node_id
    leased = stores.journal.events_of("work.leased")
    assert [(e.subject["work_id"], e.subject["node_id"]) for e in leased] == [
        (first.work_id, rival.node_id),
        (second.work_id, agent.node_id),
    ]


def test_a_claim_that_loses_every_race_reads_the_queue_again_then_finds_nothing(stores: MemoryStores) -> None:
    agent, rival = _node(stores), _node(stores)
    _submit(stores, now=NOW - 20)
    _submit(stores, now=NOW - 10)
    stores.journal.before_next("work.lease", lambda: work.claim(stores, SETTINGS, rival.caller, NOW), times=2)
    # each write loses to the rival; the next round reads the queue again and finds it empty
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is None
    assert stores.journal.calls.count("work.lease") == 4  # two each
    assert {item.node_id for item in stores.work.records.values()} == {rival.node_id}


def test_a_claim_that_keeps_losing_gives_up_after_its_rounds(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores)

    def someone_moves_first() -> None:
        stores.work.records[item.work_id].epoch += 1

    stores.journal.before_next("work.lease", someone_moves_first, times=work.CLAIM_ROUNDS)
    writes = stores.journal.writes
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is None
    assert stores.journal.calls.count("work.lease") == work.CLAIM_ROUNDS and stores.journal.writes == writes


# --- the claim's view of its node (known_callers.ClaimView) ----------------------------------


def _viewing(stores: MemoryStores, agent: Agent, now: float = NOW) -> KnownCallers:
    """A KnownCallers holding the view a first claim of ``agent`` read (one item claimed)."""
    known = KnownCallers()
    _submit(stores)
    assert work.claim(stores, SETTINGS, agent.caller, now, known) is not None
    assert known.claim_view((agent.node_id, agent.credential_sha256), now) is not None
    return known


def test_a_claim_remembers_its_node_so_the_next_claim_does_not_read_it(stores: MemoryStores) -> None:
    agent = _node(stores, {ECHO})
    known = _viewing(stores, agent)
    item = _submit(stores)
    stores.journal.reset_counts()
    claimed = work.claim(stores, SETTINGS, agent.caller, NOW + 1, known)
    assert claimed is not None and claimed.item.work_id == item.work_id
    assert stores.journal.calls == ["work.queue_front", "work.lease", "objects.presigned_get", "objects.presigned_put"]


def test_a_claim_view_is_read_again_once_it_is_old(stores: MemoryStores) -> None:
    agent = _node(stores, {ECHO}, last_heartbeat_at=NOW + 50)
    known = _viewing(stores, agent)
    _submit(stores)
    stores.journal.reset_counts()
    later = NOW + known_callers.VIEW_SECONDS + 1
    assert work.claim(stores, SETTINGS, agent.caller, later, known) is not None
    assert stores.journal.calls[0] == "nodes.get"


def test_a_claim_view_that_is_no_longer_online_by_its_age_is_read_again(stores: MemoryStores) -> None:
    """The node heartbeated since the view was read: the view's heartbeat is too old, the node's is not."""
    agent = _node(stores, {ECHO})
    known = _viewing(stores, agent)
    later = NOW + SETTINGS.stale_after_seconds
    stores.nodes.records[agent.node_id].last_heartbeat_at = later - 1
    _submit(stores)
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, agent.caller, later, known) is not None
    assert stores.journal.calls[:3] == ["nodes.get", "work.queue_front", "work.lease"]


def test_a_claim_view_whose_node_stopped_serving_a_capability_loses_one_write_then_serves_the_new_one(
    stores: MemoryStores,
) -> None:
    agent = _node(stores, {ECHO, OCR})
    known = _viewing(stores, agent)
    echo, ocr = _submit(stores, ECHO, now=NOW - 20), _submit(stores, OCR, now=NOW - 10)
    stores.nodes.records[agent.node_id].capabilities = {OCR}  # a new inventory, read by another instance
    claimed = work.claim(stores, SETTINGS, agent.caller, NOW + 1, known)
    assert claimed is not None and claimed.item.work_id == ocr.work_id
    assert _stored(stores, echo.work_id).status == "queued"
    assert stores.journal.calls.count("nodes.get") == 2  # the first claim's read, and the one after the lost write


def test_a_claim_view_of_a_node_revoked_since_is_refused_and_forgotten(stores: MemoryStores) -> None:
    """Revoked behind this instance's back: the write refuses, the read says why, and the caller is
    forgotten, so its next claim is read first and costs no write."""
    agent = _node(stores, {ECHO})
    known = _viewing(stores, agent)
    item = _submit(stores)
    stores.nodes.records[agent.node_id].credential_state = "revoked"
    _refused(
        stores,
        lambda: work.claim(stores, SETTINGS, agent.caller, NOW + 1, known),
        Unauthenticated,
        "credential_revoked",
    )
    assert (agent.node_id, agent.credential_sha256) not in known
    stores.journal.reset_counts()
    with pytest.raises(Unauthenticated):
        work.claim(stores, SETTINGS, agent.caller, NOW + 2, known)
    assert stores.journal.calls == ["nodes.get"] and _stored(stores, item.work_id).status == "queued"


def test_a_claim_view_of_a_node_gone_stale_is_refused_by_the_write_then_the_read(stores: MemoryStores) -> None:
    agent = _node(stores, {ECHO})
    known = _viewing(stores, agent)
    _submit(stores)
    stores.nodes.records[agent.node_id].liveness = "stale"  # the sweep, in another instance
    _refused(stores, lambda: work.claim(stores, SETTINGS, agent.caller, NOW + 1, known), Conflict, "node_not_online")
    assert known.claim_view((agent.node_id, agent.credential_sha256), NOW + 1) is None


def test_a_claim_view_of_an_empty_queue_is_judged_on_a_fresh_read(stores: MemoryStores) -> None:
    """Nothing queued: parking needs the node's channel, which a view does not hold."""
    agent = _node(stores, {ECHO})
    known = _viewing(stores, agent)
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, agent.caller, NOW + 1, known) is None
    assert stores.journal.calls == ["work.queue_front", "nodes.get"] and stores.journal.writes == 0


def test_each_claim_raises_the_epoch_and_counts_an_attempt(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    seen = [(item.epoch, item.attempts)]
    for n in range(2):
        work.fail(
            stores,
            agent.caller,
            item.work_id,
            typed.fail_work({"epoch": item.epoch, "reason": "oom", "retryable": True}),
            NOW + n,
            None,
        )
        claimed = _claim(stores, agent, NOW + n)
        item = claimed.item
        assert claimed.result_upload_url.endswith(
            f"/put/{work.result_key(item.work_id, item.epoch)}?expires={LEASE + SLACK}"
        )
        seen.append((item.epoch, item.attempts))
    assert seen == [(1, 1), (2, 2), (3, 3)]


def test_a_claim_from_a_stale_read_fails_the_work_guard(stores: MemoryStores) -> None:
    agent, rival = _node(stores), _node(stores)
    item = _submit(stores)
    read = stores.work.queue_front(ECHO, 1)[0]
    _claim(stores, rival)
    event = Event("work.leased", {"work_id": item.work_id}, NOW)
    with pytest.raises(GuardFailed) as raised:
        stores.work.lease(read, Holder(agent.node_id, agent.credential_sha256), NOW - 60, NOW + LEASE, NOW, event)
    assert raised.value.failed == ("work",)


# --- renew ----------------------------------------------------------------------------------------


def test_the_holder_renews_its_lease_with_one_logged_write(stores: MemoryStores) -> None:
    agent, item = _leased(stores, lease_seconds=120)
    stores.journal.reset_counts()
    renewed = work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 30, _known(agent))
    assert renewed == _stored(stores, item.work_id)
    assert (renewed.lease_expires_at, renewed.updated_at, renewed.epoch, renewed.status) == (
        NOW + 150,
        NOW + 30,
        1,
        "leased",
    )
    assert _events(stores) == [("work.lease_renewed", {"work_id": item.work_id, "epoch": "1"})]
    assert stores.journal.writes == 1
    assert "nodes.get" not in stores.journal.calls  # a known caller is not read again


def test_an_unknown_caller_is_read_once_then_remembered(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    known = KnownCallers()
    stores.journal.reset_counts()
    work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 1, known)
    work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 2, known)
    assert stores.journal.calls.count("nodes.get") == 1 and (agent.node_id, agent.credential_sha256) in known


@pytest.mark.parametrize(
    ("setup", "code"),
    [("revoked", "credential_revoked"), ("wrong-credential", "credential_invalid")],
)
def test_lease_calls_need_the_nodes_active_credential(stores: MemoryStores, setup: str, code: str) -> None:
    agent, item = _leased(stores)
    if setup == "revoked":
        stores.nodes.records[agent.node_id].credential_state = "revoked"
        caller = agent.caller
    else:
        caller = Agent(node_id=agent.node_id).caller
    body = _upload(stores, item)
    for call in (
        lambda: work.renew(stores, caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 1, KnownCallers()),
        lambda: work.complete(stores, caller, item.work_id, typed.complete_work(body), NOW + 1, None),
        lambda: work.fail(
            stores,
            caller,
            item.work_id,
            typed.fail_work({"epoch": 1, "reason": "x", "retryable": False}),
            NOW + 1,
            None,
        ),
    ):
        _refused(stores, call, Unauthenticated, code)


def test_a_known_caller_revoked_since_is_refused_by_the_write(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    known = _known(agent)
    stores.nodes.records[agent.node_id].credential_state = "revoked"
    _refused(
        stores,
        lambda: work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 1, known),
        Unauthenticated,
        "credential_revoked",
    )


def test_a_stale_epoch_or_another_node_loses_the_lease_and_changes_nothing(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    other = _node(stores)
    body = _upload(stores, item)
    for caller, epoch in [(agent.caller, 2), (other.caller, 1)]:
        for call in (
            lambda c=caller, e=epoch: work.renew(
                stores, c, item.work_id, typed.renew_work({"epoch": e}), NOW + 1, None
            ),
            lambda c=caller, e=epoch: work.complete(
                stores, c, item.work_id, typed.complete_work({**body, "epoch": e}), NOW + 1, None
            ),
            lambda c=caller, e=epoch: work.fail(
                stores, c, item.work_id, typed.fail_work({"epoch": e, "reason": "x", "retryable": True}), NOW + 1, None
            ),
        ):
            stores.journal.reset_counts()
            _refused(stores, call, Conflict, "lease_lost")
            assert not {"work.renew", "work.complete", "work.requeue", "work.bury"} & set(
                stores.journal.calls
            )  # refused on the read, before any write


@pytest.mark.parametrize("call", ["renew", "complete"])
def test_a_holder_fenced_off_by_its_own_reclaim_has_lost_the_old_epoch(stores: MemoryStores, call: str) -> None:
    """The sweep took the lease back and the same node claimed it again (epoch 2) between the old
    attempt's read and its write: the old attempt's epoch no longer holds anything."""
    agent, item = _leased(stores, _node(stores, last_heartbeat_at=NOW + LEASE))
    body = _upload(stores, item)

    def expired_and_reclaimed() -> None:
        work.release_expired(stores, NOW + LEASE)
        _claim(stores, agent, NOW + LEASE)

    stores.journal.before_next(f"work.{call}", expired_and_reclaimed)
    with pytest.raises(Conflict) as raised:
        if call == "renew":
            work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + LEASE, _known(agent))
        else:
            work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + LEASE, _known(agent))
    assert raised.value.code == "lease_lost"
    stored = _stored(stores, item.work_id)
    assert (stored.status, stored.epoch, stored.node_id, stored.result) == ("leased", 2, agent.node_id, None)
    assert stored.lease_expires_at == NOW + 2 * LEASE


def test_a_holder_whose_lease_was_reclaimed_has_lost_it(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    rival = _node(stores, last_heartbeat_at=NOW + LEASE)
    assert work.release_expired(stores, NOW + LEASE) == 1
    assert _claim(stores, rival, NOW + LEASE + 1).item.epoch == 2
    body = _upload(stores, item)
    for call in (
        lambda: work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + LEASE + 2, None),
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + LEASE + 2, None),
        lambda: work.fail(
            stores,
            agent.caller,
            item.work_id,
            typed.fail_work({"epoch": 1, "reason": "x", "retryable": True}),
            NOW + LEASE + 2,
            None,
        ),
    ):
        _refused(stores, call, Conflict, "lease_lost")


def test_a_holder_whose_lease_expired_into_the_queue_has_lost_it(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    work.release_expired(stores, NOW + LEASE)
    _refused(
        stores,
        lambda: work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + LEASE + 1, None),
        Conflict,
        "lease_lost",
    )


def test_renewing_finished_work_is_work_finished(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    work.complete(stores, agent.caller, item.work_id, typed.complete_work(_upload(stores, item)), NOW + 1, None)
    _refused(
        stores,
        lambda: work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 2, None),
        Conflict,
        "work_finished",
    )


def test_a_renewal_that_loses_to_a_cancel_says_work_cancelled(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    stores.journal.before_next("work.renew", lambda: work.cancel(stores, item.work_id, NOW + 1))
    with pytest.raises(Conflict) as raised:
        work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 1, _known(agent))
    assert raised.value.code == "work_cancelled"
    assert _stored(stores, item.work_id).lease_expires_at is None
    assert stores.journal.event_types()[-1] == "work.cancelled"


def test_a_renewal_that_loses_to_the_sweep_says_lease_lost(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    stores.journal.before_next("work.renew", lambda: work.release_expired(stores, NOW + LEASE))
    with pytest.raises(Conflict) as raised:
        work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + LEASE - 1, _known(agent))
    assert raised.value.code == "lease_lost" and _stored(stores, item.work_id).status == "queued"


def test_a_renewal_that_loses_to_a_revocation_is_unauthenticated(stores: MemoryStores) -> None:
    agent, item = _leased(stores)

    def admin_revokes() -> None:
        stores.nodes.records[agent.node_id].credential_state = "revoked"

    stores.journal.before_next("work.renew", admin_revokes)
    expires = _stored(stores, item.work_id).lease_expires_at
    with pytest.raises(Unauthenticated) as raised:
        work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 1, _known(agent))
    assert raised.value.code == "credential_revoked" and _stored(stores, item.work_id).lease_expires_at == expires


@pytest.mark.parametrize("body", [{}, {"epoch": 0}, {"epoch": "1"}, {"epoch": 1, "extra": True}])
def test_an_invalid_lease_body_changes_nothing(stores: MemoryStores, body: dict[str, Any]) -> None:
    agent, item = _leased(stores)
    _refused(
        stores,
        lambda: work.renew(stores, agent.caller, item.work_id, typed.renew_work(body), NOW, None),
        Invalid,
        "invalid_request",
    )


def test_lease_calls_on_unknown_work_are_not_found(stores: MemoryStores) -> None:
    agent = _node(stores)
    _refused(
        stores,
        lambda: work.renew(stores, agent.caller, "work_" + "0" * 32, typed.renew_work({"epoch": 1}), NOW, None),
        NotFound,
        "work_not_found",
    )


# --- complete -------------------------------------------------------------------------------------


def test_completing_stores_the_result_and_ends_the_lease(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item)
    stores.journal.reset_counts()
    done = work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 5, _known(agent))
    assert done == _stored(stores, item.work_id)
    key = work.sealed_key(item.work_id, 1)
    assert done.status == "succeeded" and done.result == {"sha256": body["sha256"], "size": len(RESULT), "key": key}
    assert done.lease_expires_at is None
    assert (done.finished_at, done.updated_at, done.node_id, done.epoch, done.attempts) == (
        NOW + 5,
        NOW + 5,
        agent.node_id,
        1,
        1,
    )
    assert _events(stores) == [("work.succeeded", {"work_id": item.work_id, "node_id": agent.node_id, "epoch": "1"})]
    assert stores.journal.writes == 1
    assert work.release_node(stores, agent.node_id, NOW + 6) == 0


def test_the_checked_result_is_sealed_where_no_upload_url_reaches(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item)
    stores.journal.reset_counts()
    done = work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None)
    objects = [call for call in stores.journal.calls if call.startswith("objects.")]
    assert objects == ["objects.digest", "objects.copy", "objects.digest"]  # checked, copied, checked again
    assert done.result is not None and done.result["key"] == f"work-sealed/{item.work_id}/1.json"
    _upload(stores, item, b'{"replaced": true}')  # the upload URL is still valid after complete
    assert stores.objects.body(done.result["key"]) == RESULT


def test_an_upload_replaced_between_the_check_and_the_copy_is_refused(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item)
    original = stores.objects.copy

    def replace_then_copy(source_key: str, key: str) -> bool:
        _upload(stores, item, b'{"replaced": true}')
        return original(source_key, key)

    stores.objects.copy = replace_then_copy  # type: ignore[method-assign]
    with pytest.raises(Conflict) as raised:
        work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None)
    assert raised.value.code == "result_checksum_mismatch"
    assert _stored(stores, item.work_id).status == "leased"


def test_an_empty_result_can_complete(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    done = work.complete(
        stores, agent.caller, item.work_id, typed.complete_work(_upload(stores, item, b"")), NOW + 1, None
    )
    assert done.result is not None and done.result["size"] == 0


def test_completing_without_an_upload_is_result_missing(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = {"epoch": 1, "sha256": hashlib.sha256(RESULT).hexdigest(), "size": len(RESULT)}
    _refused(
        stores,
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None),
        Conflict,
        "result_missing",
    )


def test_an_upload_for_another_epoch_is_not_this_epochs_result(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item, epoch=2)
    body["epoch"] = 1
    _refused(
        stores,
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None),
        Conflict,
        "result_missing",
    )


@pytest.mark.parametrize("wrong", ["sha256", "size"])
def test_a_result_that_does_not_match_its_digest_is_refused(stores: MemoryStores, wrong: str) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item)
    body[wrong] = hashlib.sha256(b"other").hexdigest() if wrong == "sha256" else len(RESULT) + 1
    _refused(
        stores,
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None),
        Conflict,
        "result_checksum_mismatch",
    )
    assert _stored(stores, item.work_id).status == "leased"


def test_a_result_over_the_limit_is_too_large(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item, b"x" * (protocol.MAX_RESULT_BYTES + 1))
    body["size"] = protocol.MAX_RESULT_BYTES
    _refused(
        stores,
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None),
        TooLarge,
        "result_too_large",
    )


def test_a_result_of_exactly_the_limit_is_accepted(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item, b"x" * protocol.MAX_RESULT_BYTES)
    assert (
        work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None).status
        == "succeeded"
    )


def test_completing_twice_is_work_finished(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item)
    work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None)
    _refused(
        stores,
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 2, None),
        Conflict,
        "work_finished",
    )
    _refused(stores, lambda: work.cancel(stores, item.work_id, NOW + 2), Conflict, "work_finished")


def test_a_completion_that_loses_to_a_cancel_says_work_cancelled(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item)
    stores.journal.before_next("work.complete", lambda: work.cancel(stores, item.work_id, NOW + 1))
    with pytest.raises(Conflict) as raised:
        work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + 1, None)
    assert raised.value.code == "work_cancelled"
    assert _stored(stores, item.work_id).result is None
    assert stores.journal.event_types()[-2:] == ["work.leased", "work.cancelled"]


# --- fail -----------------------------------------------------------------------------------------


def _fail(
    stores: MemoryStores, agent: Agent, item: WorkItem, retryable: bool, now: float = NOW + 1, reason: str = "oom"
) -> WorkItem:
    body = {"epoch": item.epoch, "reason": reason, "retryable": retryable}
    return work.fail(stores, agent.caller, item.work_id, typed.fail_work(body), now, None)


def test_a_retryable_failure_with_attempts_left_requeues_and_keeps_the_error(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    stores.journal.reset_counts()
    failed = _fail(stores, agent, item, True, NOW + 7)
    assert failed == _stored(stores, item.work_id)
    assert (failed.status, failed.queued_at, failed.updated_at) == ("queued", NOW + 7, NOW + 7)
    assert failed.lease_expires_at is None
    assert (failed.epoch, failed.attempts, failed.finished_at) == (1, 1, None)
    assert failed.errors == [
        {"attempt": 1, "epoch": 1, "node_id": agent.node_id, "reason": "oom", "retryable": True, "at": NOW + 7}
    ]
    assert _events(stores) == [
        ("work.requeued", {"work_id": item.work_id, "epoch": "1", "to": "queued", "cause": "agent"})
    ]
    assert stores.journal.writes == 1
    assert _claim(stores, agent, NOW + 8).item.epoch == 2


def test_a_failure_that_is_not_retryable_is_dead_at_once(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    stores.journal.reset_counts()
    failed = _fail(stores, agent, item, False, NOW + 7, reason="bad input")
    assert (failed.status, failed.finished_at, failed.queued_at, failed.lease_expires_at) == (
        "dead",
        NOW + 7,
        None,
        None,
    )
    assert failed.errors is not None and [e["reason"] for e in failed.errors] == ["bad input"]
    assert failed.errors[0]["retryable"] is False
    assert _events(stores) == [("work.dead", {"work_id": item.work_id, "epoch": "1", "to": "dead", "cause": "agent"})]
    assert work.claim(stores, SETTINGS, agent.caller, NOW + 8) is None


def test_the_last_attempt_failing_is_dead_keeping_every_reason(stores: MemoryStores) -> None:
    agent, item = _leased(stores, max_attempts=2)
    _fail(stores, agent, item, True, NOW + 1, reason="first")
    item = _claim(stores, agent, NOW + 2).item
    failed = _fail(stores, agent, item, True, NOW + 3, reason="second")
    assert failed.status == "dead" and failed.attempts == 2
    assert failed.errors is not None
    assert [(e["attempt"], e["epoch"], e["reason"]) for e in failed.errors] == [(1, 1, "first"), (2, 2, "second")]
    assert stores.journal.event_types()[-1] == "work.dead"


def test_a_single_attempt_is_dead_after_one_retryable_failure(stores: MemoryStores) -> None:
    agent, item = _leased(stores, max_attempts=1)
    assert _fail(stores, agent, item, True).status == "dead"


def _node_fault(stores: MemoryStores, agent: Agent, item: WorkItem, now: float) -> WorkItem:
    body = {"epoch": item.epoch, "reason": "worker_busy: every slot is running a job", "retryable": True}
    return work.fail(stores, agent.caller, item.work_id, typed.fail_work({**body, "node_fault": True}), now, None)


def test_a_node_fault_goes_back_to_the_queue_without_counting_the_attempt(stores: MemoryStores) -> None:
    """Its only attempt spent on a node whose worker was busy: the item is not dead, it is queued
    with no attempt counted, and the error says the node was at fault."""
    agent, item = _leased(stores, max_attempts=1)
    failed = _node_fault(stores, agent, item, NOW + 3)
    assert (failed.status, failed.attempts, failed.epoch) == ("queued", 0, 1)
    assert failed.errors is not None and failed.errors[0]["node_fault"] is True
    assert failed.errors[0]["retryable"] is True
    again = _claim(stores, agent, NOW + 4).item
    assert (again.attempts, again.epoch) == (1, 2)  # the next claim is its first counted attempt


def test_node_faults_stop_being_free_after_the_cap(stores: MemoryStores) -> None:
    """A faulty node cannot keep an item in play, and its errors growing, forever."""
    agent, item = _leased(stores, max_attempts=1)
    for n in range(work.MAX_NODE_FAULTS):
        assert _node_fault(stores, agent, item, NOW + 2 * n + 1).status == "queued"
        item = _claim(stores, agent, NOW + 2 * n + 2).item
    failed = _node_fault(stores, agent, item, NOW + 100)
    assert (failed.status, failed.attempts) == ("dead", 1)  # this one counted: no attempt left
    assert failed.errors is not None and len(failed.errors) == work.MAX_NODE_FAULTS + 1


def test_failing_with_a_stale_epoch_changes_nothing(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = {"epoch": 2, "reason": "oom", "retryable": True}
    _refused(
        stores,
        lambda: work.fail(stores, agent.caller, item.work_id, typed.fail_work(body), NOW + 1, None),
        Conflict,
        "lease_lost",
    )


@pytest.mark.parametrize(
    "body",
    [
        {"epoch": 1, "reason": "", "retryable": True},
        {"epoch": 1, "reason": "x" * 1025, "retryable": True},
        {"epoch": 1, "reason": "x"},
        {"epoch": 1, "reason": "x", "retryable": True, "node_fault": "yes"},
    ],
    ids=["empty-reason", "long-reason", "no-retryable", "node-fault-not-boolean"],
)
def test_an_invalid_failure_body_changes_nothing(stores: MemoryStores, body: dict[str, Any]) -> None:
    agent, item = _leased(stores)
    _refused(
        stores,
        lambda: work.fail(stores, agent.caller, item.work_id, typed.fail_work(body), NOW + 1, None),
        Invalid,
        "invalid_request",
    )


# --- the sweep: expired leases and offline holders ------------------------------------------------


def test_an_expired_lease_goes_back_to_the_queue(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    assert work.release_expired(stores, NOW + LEASE - 1) == 0
    stores.journal.reset_counts()
    assert work.release_expired(stores, NOW + LEASE) == 1  # expiry is inclusive
    released = _stored(stores, item.work_id)
    assert (released.status, released.queued_at, released.lease_expires_at) == ("queued", NOW + LEASE, None)
    assert released.errors is not None and released.errors[0]["node_id"] == agent.node_id
    assert released.errors[0]["reason"].startswith("lease_expired")
    assert _events(stores) == [
        ("work.requeued", {"work_id": item.work_id, "epoch": "1", "to": "queued", "cause": "lease_expired"})
    ]
    assert stores.journal.writes == 1


def test_an_expired_last_attempt_is_dead(stores: MemoryStores) -> None:
    _, item = _leased(stores, max_attempts=1)
    assert work.release_expired(stores, NOW + LEASE) == 1
    released = _stored(stores, item.work_id)
    assert (released.status, released.finished_at) == ("dead", NOW + LEASE)
    assert stores.journal.events[-1].subject == {
        "work_id": item.work_id,
        "epoch": "1",
        "to": "dead",
        "cause": "lease_expired",
    }


def test_release_expired_takes_only_expired_leases(stores: MemoryStores) -> None:
    agent = _node(stores)
    short = _submit(stores, lease_seconds=10, now=NOW - 20)
    long = _submit(stores, lease_seconds=100, now=NOW - 10)
    _claim(stores, agent)
    _claim(stores, agent)
    assert work.release_expired(stores, NOW + 50) == 1
    assert _stored(stores, short.work_id).status == "queued" and _stored(stores, long.work_id).status == "leased"


def test_a_lease_renewed_after_the_sweep_read_it_is_skipped(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    stores.journal.before_next(
        "work.requeue",
        lambda: work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + LEASE, None),
    )
    stores.journal.reset_counts()
    assert work.release_expired(stores, NOW + LEASE) == 0
    kept = _stored(stores, item.work_id)
    assert (kept.status, kept.node_id, kept.lease_expires_at) == ("leased", agent.node_id, NOW + 2 * LEASE)
    assert stores.journal.event_types() == ["work.lease_renewed"] and stores.journal.writes == 1  # the renewal only


def test_a_lease_completed_after_the_sweep_read_it_is_skipped(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    body = _upload(stores, item)
    stores.journal.before_next(
        "work.requeue",
        lambda: work.complete(stores, agent.caller, item.work_id, typed.complete_work(body), NOW + LEASE, None),
    )
    assert work.release_expired(stores, NOW + LEASE) == 0
    assert _stored(stores, item.work_id).status == "succeeded"
    assert stores.journal.event_types()[-1] == "work.succeeded"


def test_an_offline_nodes_leases_are_released_at_once(stores: MemoryStores) -> None:
    agent, other = _node(stores), _node(stores)
    first = _submit(stores, now=NOW - 30)
    second = _submit(stores, now=NOW - 20, max_attempts=1)
    others = _submit(stores, now=NOW - 10)
    _claim(stores, agent)
    _claim(stores, agent)
    _claim(stores, other)
    stores.journal.reset_counts()
    assert work.release_node(stores, agent.node_id, NOW + 1) == 2
    assert _stored(stores, first.work_id).status == "queued" and _stored(stores, second.work_id).status == "dead"
    assert _stored(stores, others.work_id).node_id == other.node_id
    assert sorted((e.type, e.subject["work_id"], e.subject["cause"]) for e in stores.journal.events) == sorted(
        [("work.requeued", first.work_id, "node_offline"), ("work.dead", second.work_id, "node_offline")]
    )
    assert stores.journal.writes == 2
    assert work.release_node(stores, agent.node_id, NOW + 2) == 0


def test_a_lease_the_node_claimed_again_after_release_node_read_it_is_skipped(stores: MemoryStores) -> None:
    """The node came back: its old lease expired and it claimed the item again (epoch 2) between
    the read and the write; the release is fenced by the epoch it read."""
    agent, item = _leased(stores, _node(stores, last_heartbeat_at=NOW + LEASE))

    def expired_and_reclaimed() -> None:
        work.release_expired(stores, NOW + LEASE)
        _claim(stores, agent, NOW + LEASE)

    stores.journal.before_next("work.requeue", expired_and_reclaimed)
    assert work.release_node(stores, agent.node_id, NOW + LEASE) == 0
    stored = _stored(stores, item.work_id)
    assert (stored.status, stored.epoch, stored.node_id) == ("leased", 2, agent.node_id)


def test_a_lease_that_moved_after_release_node_read_it_is_skipped(stores: MemoryStores) -> None:
    agent, item = _leased(stores)
    stores.journal.before_next("work.requeue", lambda: _fail(stores, agent, item, False, NOW + 1))
    assert work.release_node(stores, agent.node_id, NOW + 1) == 0
    assert _stored(stores, item.work_id).status == "dead"
    assert stores.journal.event_types()[-1] == "work.dead" and len(stores.journal.events_of("work.dead")) == 1


# --- the whole life -------------------------------------------------------------------------------


def test_every_transition_logs_exactly_one_event(stores: MemoryStores) -> None:
    agent = _node(stores)
    item = _submit(stores)
    _claim(stores, agent)
    work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 10, None)
    _fail(stores, agent, _stored(stores, item.work_id), True, NOW + 11)
    _claim(stores, agent, NOW + 12)
    work.release_expired(stores, NOW + 12 + LEASE)
    late = _node(stores, last_heartbeat_at=NOW + 100)  # the first node's heartbeat is too old by now
    _claim(stores, late, NOW + 100)
    work.release_node(stores, late.node_id, NOW + 101)
    # three attempts are spent: the item is dead, and the last release said so
    assert _stored(stores, item.work_id).status == "dead"
    assert stores.journal.event_types() == [
        "work.submitted",
        "work.leased",
        "work.lease_renewed",
        "work.requeued",
        "work.leased",
        "work.requeued",
        "work.leased",
        "work.dead",
    ]
    # one write per event
    assert stores.journal.writes == len(stores.journal.events) == 8
    errors = _stored(stores, item.work_id).errors
    assert errors is not None and [e["epoch"] for e in errors] == [1, 2, 3]


def test_an_idempotent_retry_with_other_options_is_a_conflict(stores: MemoryStores) -> None:
    work.submit(stores, typed.submit_work(_body(ECHO, {"text": "same"}, idempotency_key="job-0002")), NOW)
    with pytest.raises(Conflict) as raised:
        work.submit(
            stores, typed.submit_work(_body(ECHO, {"text": "same"}, idempotency_key="job-0002", max_attempts=5)), NOW
        )
    assert raised.value.code == "idempotency_key_reused"
