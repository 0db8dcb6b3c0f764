"""Many nodes claiming from one work queue at the same instant, over HTTP.

One round: submit ``items`` ``diagnostic.echo`` items with a round-unique input, heartbeat every
node, release every claimer together (a barrier), and let each loop claim → PUT a result →
complete until nothing of the round is left to claim. Every 200 claim answer is recorded with
the node that got it and when, so the caller can judge whether the database let two nodes hold
one item. Items of other tests (the queue is shared with the session's other users of the same
process) are completed too, but counted apart.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from tests.support.api import AgentIdentity, ControlPlane

ECHO = "diagnostic.echo"
#: Consecutive empty (204) or failed claims after which a claimer gives up, whatever the listing says.
MAX_EMPTY_CLAIMS = 50
#: How long a claimer waits after an empty claim while some of the round's items are still queued.
EMPTY_BACKOFF_SECONDS = 0.05
#: A queued-items listing is shared by the claimers for this long (it is a paginated Scan).
LISTING_FRESH_SECONDS = 0.25
SETUP_THREADS = 8
#: Leases outlive any round, so no item is taken back and re-queued while its holder completes it
#: (a re-claim after an expired lease is correct, but this test is about simultaneous claims).
LEASE_SECONDS = 600
#: Claimers heartbeat this often, as agents do: a round may outlast the stale threshold
#: (MODELFORGE_NODE_STALE_AFTER_SECONDS, 60 s in the tests, inherited by `local up`).
HEARTBEAT_EVERY_SECONDS = int(os.environ.get("MODELFORGE_NODE_STALE_AFTER_SECONDS", "60")) / 4
REQUEST_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class Claimed:
    """One 200 answer to a claim."""

    work_id: str
    epoch: int
    node_id: str
    #: monotonic times: the claim request was sent, its answer came, the holder's complete was answered
    sent: float
    answered: float
    released: float | None
    complete_status: int | None


@dataclass
class RoundResult:
    round_ids: frozenset[str]
    claims: list[Claimed]
    foreign_claims: int
    claim_statuses: dict[int, int]
    complete_statuses: dict[int, int]
    final_statuses: dict[str, str]
    problems: list[str]
    seconds: float
    claimers: int
    gave_up: int = 0

    @property
    def claimed_ids(self) -> set[str]:
        return {claim.work_id for claim in self.claims}

    @property
    def claimed_twice(self) -> dict[str, list[Claimed]]:
        """Items answered 200 more than once (none should be: no item fails or expires in a round)."""
        by_id: dict[str, list[Claimed]] = collections.defaultdict(list)
        for claim in self.claims:
            by_id[claim.work_id].append(claim)
        return {work_id: found for work_id, found in by_id.items() if len(found) > 1}

    @property
    def same_epoch_twice(self) -> list[tuple[str, int]]:
        """(work_id, epoch) pairs answered 200 more than once: two holders of one fencing token."""
        counts = collections.Counter((claim.work_id, claim.epoch) for claim in self.claims)
        return sorted(pair for pair, count in counts.items() if count > 1)

    @property
    def overlapping_holders(self) -> list[tuple[Claimed, Claimed]]:
        """Two nodes holding one item at once: the later claim was answered 200 before the earlier
        holder's complete was answered, or the earlier holder never completed (no lease expires
        within a round, so the earlier holder had not lost its lease)."""
        found = []
        for claims in self.claimed_twice.values():
            ordered = sorted(claims, key=lambda claim: claim.answered)
            for first, second in itertools.combinations(ordered, 2):
                if first.node_id == second.node_id and first.epoch != second.epoch:
                    continue  # one node, one lease after another: not two holders
                if first.released is None or first.complete_status != 200 or second.sent < first.released:
                    found.append((first, second))
        return found

    @property
    def double_claim(self) -> bool:
        """Two holders of one item at the same time."""
        return bool(self.same_epoch_twice or self.overlapping_holders)

    @property
    def not_claimed(self) -> set[str]:
        return set(self.round_ids) - self.claimed_ids

    @property
    def not_succeeded(self) -> dict[str, str]:
        return {work_id: status for work_id, status in self.final_statuses.items() if status != "succeeded"}

    @property
    def rate(self) -> float:
        return len(self.claims) / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        return (
            f"{len(self.round_ids)} items, {self.claimers} claimers, {self.seconds:.1f} s:"
            f" {len(self.claims)} claims of the round's items ({len(self.claimed_ids)} distinct),"
            f" {self.foreign_claims} of other items; claim answers {self.claim_statuses},"
            f" complete answers {self.complete_statuses}; claimed twice {len(self.claimed_twice)},"
            f" same (work_id, epoch) twice {len(self.same_epoch_twice)},"
            f" overlapping holders {len(self.overlapping_holders)}; not claimed {len(self.not_claimed)},"
            f" not succeeded {len(self.not_succeeded)}; claimers that gave up {self.gave_up};"
            f" problems {self.problems[:5]}"
        )


@dataclass
class Claimer:
    identity: AgentIdentity
    client: ControlPlane


def _client(cp: ControlPlane) -> ControlPlane:
    session = requests.Session()
    session.trust_env = False  # loopback only: no proxies
    return ControlPlane(cp.base_url, cp.admin_token, session=session, timeout=REQUEST_TIMEOUT_SECONDS)


class _ThreadClients:
    """One admin client (its own requests.Session) per thread of a pool."""

    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp
        self._local = threading.local()
        self._lock = threading.Lock()
        self._made: list[ControlPlane] = []

    def get(self) -> ControlPlane:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = _client(self._cp)
            with self._lock:
                self._made.append(client)
        return client

    def close(self) -> None:
        for client in self._made:
            client.session.close()


def enroll_claimers(cp: ControlPlane, count: int) -> list[Claimer]:
    """``count`` enrolled nodes that serve ``diagnostic.echo``, each with its own requests.Session."""

    def one(_: int) -> Claimer:
        client = _client(cp)
        return Claimer(identity=client.worker_node(("cpu", ECHO)), client=client)

    with ThreadPoolExecutor(max_workers=SETUP_THREADS) as pool:
        return list(pool.map(one, range(count)))


def close_claimers(claimers: list[Claimer]) -> None:
    for claimer in claimers:
        claimer.client.session.close()


def heartbeat_all(claimers: list[Claimer]) -> None:
    def one(claimer: Claimer) -> None:
        response = claimer.client.heartbeat(claimer.identity)
        assert response.status_code == 200 and response.json()["status"] == "online", response.text

    with ThreadPoolExecutor(max_workers=SETUP_THREADS) as pool:
        list(pool.map(one, claimers))


def submit_round(cp: ControlPlane, items: int, tag: str) -> frozenset[str]:
    """``items`` echo items whose inputs name this round (so no idempotency key or input repeats)."""
    clients = _ThreadClients(cp)

    def one(index: int) -> str:
        response = clients.get().submit_work(ECHO, {"round": tag, "index": index}, lease_seconds=LEASE_SECONDS)
        assert response.status_code == 201, response.text
        return response.json()["work_id"]

    try:
        with ThreadPoolExecutor(max_workers=SETUP_THREADS) as pool:
            ids = frozenset(pool.map(one, range(items)))
    finally:
        clients.close()
    assert len(ids) == items
    return ids


class _QueuedListing:
    """Which of the round's items the admin listing shows queued; one listing shared for a moment."""

    def __init__(self, cp: ControlPlane, round_ids: frozenset[str]) -> None:
        self._client = _client(cp)
        self._round_ids = round_ids
        self._lock = threading.Lock()
        self._at = -1.0
        self._queued: set[str] = set()

    def queued(self) -> set[str]:
        with self._lock:
            if time.monotonic() - self._at > LISTING_FRESH_SECONDS:
                self._queued = self._list() & self._round_ids
                self._at = time.monotonic()
            return set(self._queued)

    def _list(self) -> set[str]:
        found: set[str] = set()
        token = None
        while True:
            params = {
                "status": "queued",
                "capability": ECHO,
                "limit": "100",
                **({"next_token": token} if token else {}),
            }
            response = self._client.admin("GET", "/api/v1/admin/work", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            found.update(item["work_id"] for item in page["work"])
            token = page["next_token"]
            if not token:
                return found

    def close(self) -> None:
        self._client.session.close()


def claim_round(
    cp: ControlPlane,
    claimers: list[Claimer],
    items: int = 200,
    deadline_seconds: float = 120,
    stop_at_double_claim: bool = False,
) -> RoundResult:
    """One round (see the module's docstring); nothing is asserted here, everything is recorded.

    ``stop_at_double_claim``: every claimer stops as soon as one of the round's items is answered
    200 a second time (a negative control needs no more).
    """
    tag = f"claim-race-{time.time_ns()}"
    round_ids = submit_round(cp, items, tag)
    heartbeat_all(claimers)  # every node online (its heartbeat fresh) when the round starts
    shared = _Round(cp, len(claimers), round_ids, deadline_seconds, stop_at_double_claim)
    try:
        with ThreadPoolExecutor(max_workers=len(claimers)) as pool:
            for future in [pool.submit(shared.claim_loop, claimer) for claimer in claimers]:
                future.result()
    finally:
        shared.listing.close()
    seconds = time.monotonic() - shared.started
    return RoundResult(
        round_ids=round_ids,
        claims=shared.claims,
        foreign_claims=shared.foreign,
        claim_statuses=dict(shared.claim_statuses),
        complete_statuses=dict(shared.complete_statuses),
        final_statuses=final_statuses(cp, round_ids),
        problems=shared.problems,
        seconds=seconds,
        claimers=len(claimers),
        gave_up=shared.gave_up,
    )


class _Round:
    """What the claimers of one round share, behind one lock, and the loop each of them runs."""

    def __init__(
        self,
        cp: ControlPlane,
        claimers: int,
        round_ids: frozenset[str],
        deadline_seconds: float,
        stop_at_double_claim: bool,
    ) -> None:
        self.round_ids = round_ids
        self.deadline_seconds = deadline_seconds
        self.stop_at_double_claim = stop_at_double_claim
        self.listing = _QueuedListing(cp, round_ids)
        self.barrier = threading.Barrier(claimers)
        self.stop = threading.Event()
        self.guard = threading.Lock()
        self.claims: list[Claimed] = []
        self.claimed_ids: set[str] = set()
        self.claim_statuses: collections.Counter[int] = collections.Counter()
        self.complete_statuses: collections.Counter[int] = collections.Counter()
        self.problems: list[str] = []
        self.foreign = 0
        self.gave_up = 0
        self.started = 0.0

    def problem(self, text: str) -> None:
        with self.guard:
            self.problems.append(text)

    def nothing_left(self) -> bool:
        with self.guard:
            unclaimed = bool(self.round_ids - self.claimed_ids)
        return not unclaimed or not self.listing.queued()

    def complete(self, claimer: Claimer, answer: dict[str, Any]) -> int | None:
        body = f'{{"echo":"{answer["work_id"]}","epoch":{answer["epoch"]}}}'.encode()
        try:
            upload = requests.put(
                answer["result_upload_url"], data=body, timeout=REQUEST_TIMEOUT_SECONDS, allow_redirects=False
            )
            if upload.status_code != 200:
                self.problem(f"upload of {answer['work_id']} answered {upload.status_code}")
                return None
            done = claimer.client.lease_call(
                claimer.identity,
                answer["work_id"],
                "complete",
                {"epoch": answer["epoch"], "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)},
            )
        except requests.RequestException as error:
            self.problem(f"upload or complete of {answer['work_id']}: {error}")
            return None
        if done.status_code != 200 and answer["work_id"] in self.round_ids:
            self.problem(
                f"complete of {answer['work_id']}@{answer['epoch']} answered {done.status_code}: {done.text[:200]}"
            )
        return done.status_code

    def claim_loop(self, claimer: Claimer) -> None:
        node_id = claimer.identity.node_id
        assert node_id is not None
        self.barrier.wait(timeout=REQUEST_TIMEOUT_SECONDS)
        with self.guard:
            self.started = self.started or time.monotonic()
        deadline = time.monotonic() + self.deadline_seconds
        last_heartbeat = time.monotonic()
        empty = 0
        while empty < MAX_EMPTY_CLAIMS:
            if self.stop.is_set():
                return
            if time.monotonic() > deadline:
                self.problem(f"{node_id}: the round's deadline of {self.deadline_seconds:g} s passed")
                return
            last_heartbeat = self._heartbeat_when_due(claimer, node_id, last_heartbeat)
            sent = time.monotonic()
            try:
                response = claimer.client.claim(claimer.identity)
            except requests.RequestException as error:
                self.problem(f"claim by {node_id}: {error}")
                empty += 1
                continue
            answered = time.monotonic()
            with self.guard:
                self.claim_statuses[response.status_code] += 1
            if response.status_code == 204:
                empty += 1
                if self.nothing_left():
                    return
                time.sleep(EMPTY_BACKOFF_SECONDS)
                continue
            if response.status_code != 200:
                self.problem(f"claim by {node_id} answered {response.status_code}: {response.text[:200]}")
                empty += 1
                continue
            empty = 0
            self._settle(claimer, node_id, response.json(), sent, answered)
        with self.guard:
            self.gave_up += 1

    def _heartbeat_when_due(self, claimer: Claimer, node_id: str, last_heartbeat: float) -> float:
        """Heartbeat as a real agent does between claims (a long round must not make the node
        stale); the time of the node's last heartbeat."""
        if time.monotonic() - last_heartbeat <= HEARTBEAT_EVERY_SECONDS:
            return last_heartbeat
        beat = claimer.client.heartbeat(claimer.identity)
        if beat.status_code != 200:
            self.problem(f"heartbeat of {node_id} answered {beat.status_code}: {beat.text[:200]}")
        return time.monotonic()

    def _settle(self, claimer: Claimer, node_id: str, answer: dict[str, Any], sent: float, answered: float) -> None:
        """Record a claimed item (a second claim of one stops the round when asked to), then complete it."""
        ours = answer["work_id"] in self.round_ids
        if ours:
            with self.guard:
                again = answer["work_id"] in self.claimed_ids
                self.claimed_ids.add(answer["work_id"])
            if again and self.stop_at_double_claim:
                self.stop.set()
        status = self.complete(claimer, answer)
        released = time.monotonic()
        with self.guard:
            if ours:
                self.complete_statuses[status or 0] += 1
                self.claims.append(
                    Claimed(answer["work_id"], int(answer["epoch"]), node_id, sent, answered, released, status)
                )
            else:
                self.foreign += 1


def final_statuses(cp: ControlPlane, work_ids: frozenset[str]) -> dict[str, str]:
    """Each item's status by GET /api/v1/admin/work/{id} (``http <code>`` when that is not 200)."""
    clients = _ThreadClients(cp)
    ordered = sorted(work_ids)

    def one(work_id: str) -> str:
        response = clients.get().admin("GET", f"/api/v1/admin/work/{work_id}")
        return response.json()["status"] if response.status_code == 200 else f"http {response.status_code}"

    try:
        with ThreadPoolExecutor(max_workers=SETUP_THREADS) as pool:
            return dict(zip(ordered, pool.map(one, ordered), strict=True))
    finally:
        clients.close()
