"""The work loop's pieces on their own, in fake time (``FakeTime``): the lease keeper's schedule
(and ``renew_now``) and what each renewal answer does, settling's backoff bounded by the lease,
the signals a fatal answer raises, one job timed on the injected clock, and a job whose lease is
lost while its worker runs it (cancelled on a worker that can, only let go on one that cannot).
No test waits on real time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import requests
from modelforge_node_agent.control_plane import COMPLETE, FAIL, RENEW, ControlPlaneClient
from modelforge_node_agent.failures import RedirectRefused, Refused, TransientFailure
from modelforge_node_agent.identity import Identity, new_identity
from modelforge_node_agent.work.claimed import Lease
from modelforge_node_agent.work.job import Job, Station
from modelforge_node_agent.work.lease_keeper import MIN_EARLY_RENEW_SECONDS, LeaseKeeper
from modelforge_node_agent.work.settle import SETTLE_BACKOFF, UNSETTLED, Settler
from modelforge_node_agent.work.signals import Signals
from modelforge_node_agent.work.transfers import PresignedObjects
from modelforge_node_agent.work.worker_view import WorkerView
from modelforge_node_agent.worker_client import OK, WorkerCapability, WorkerClient, WorkerRefused, WorkerStatus

from tests.agent.fake_time import FakeTime, StillTime

LEASE = Lease("w-1", "diagnostic.echo", 3, 60, "https://objects.example/in", "https://objects.example/out")
Answer = Exception | None


class ScriptedPlane(ControlPlaneClient):
    """Answers each lease call from a script (None: accepted; an exception: raised), and records
    (action, fake time) of each; once the script is spent every call is accepted."""

    def __init__(self, clock: Callable[[], float], script: list[Answer]) -> None:
        self._clock, self._script = clock, list(script)
        self.calls: list[tuple[str, float]] = []

    def lease(self, work_id: str, action: str, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        self.calls.append((action, self._clock()))
        answer = self._script.pop(0) if self._script else None
        if answer is not None:
            raise answer
        return {"status": "leased"}


def _refused(status: int, code: str) -> Refused:
    return Refused(status, code, "POST", f"/api/v1/agent/work/w-1/{RENEW}", None, None)


def _transient() -> TransientFailure:
    return TransientFailure("HTTP 503", "POST", f"/api/v1/agent/work/w-1/{RENEW}", status=503)


def _keeper(time: FakeTime, script: list[Answer], signals: Signals | None = None) -> tuple[LeaseKeeper, ScriptedPlane]:
    plane = ScriptedPlane(time.clock, script)
    keeper = LeaseKeeper(plane, new_identity("https://cp.example"), LEASE, 20.0, signals or Signals(), time.timing())
    return keeper, plane


# --- the lease keeper --------------------------------------------------------------------------


def test_lease_keeper_renews_at_each_interval_of_the_fake_clock_until_the_lease_is_lost() -> None:
    time = FakeTime(now=1000.0)
    keeper, plane = _keeper(time, [None, None, _refused(409, "lease_lost")])
    keeper.run()
    assert plane.calls == [(RENEW, 1020.0), (RENEW, 1040.0), (RENEW, 1060.0)]
    assert time.waits == [20.0, 20.0, 20.0]
    assert keeper.renewals == 2 and keeper.lost.is_set() and keeper.lost_code == "lease_lost"


def test_lease_keeper_renewal_moves_the_expiry_to_the_ask_plus_the_lease() -> None:
    time = FakeTime(now=1000.0)
    keeper, _ = _keeper(time, [])
    assert keeper.expires_at == 1060.0
    time.now = 1020.0
    assert keeper.renew() is True
    assert keeper.expires_at == 1080.0 and keeper.renewals == 1


def test_lease_keeper_stopped_before_its_first_interval_renews_nothing() -> None:
    time = FakeTime()
    keeper, plane = _keeper(time, [])
    keeper.stop()
    keeper.run()
    assert plane.calls == [] and time.waits == []


def test_lease_keeper_transient_failure_keeps_the_lease_and_tries_at_the_next_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime(now=1000.0)
    keeper, plane = _keeper(time, [_transient(), _refused(409, "work_cancelled")])
    with caplog.at_level(logging.WARNING, logger="modelforge.agent"):
        keeper.run()
    assert [at for _, at in plane.calls] == [1020.0, 1040.0]
    assert keeper.renewals == 0 and keeper.expires_at == 1060.0 and keeper.lost_code == "work_cancelled"
    events = [(getattr(record, "event", None), getattr(record, "error", None)) for record in caplog.records]
    assert events == [("work_renew_failed", "HTTP 503"), ("work_lease_lost", None)]


def test_lease_keeper_other_refusal_is_logged_and_renewing_goes_on() -> None:
    time = FakeTime()
    keeper, plane = _keeper(time, [_refused(400, "invalid_body"), _refused(409, "lease_lost")])
    keeper.run()
    assert len(plane.calls) == 2 and keeper.lost_code == "lease_lost"


@pytest.mark.parametrize("status", [401, 403])
def test_lease_keeper_refused_credential_loses_the_lease_and_halts_the_loop(status: int) -> None:
    signals, refused = Signals(), _refused(status, "credential_revoked")
    keeper, _ = _keeper(FakeTime(), [refused], signals)
    keeper.run()
    assert keeper.lost_code == "credential_revoked"
    assert signals.fatal is refused and signals.stopping() and signals.hinted.is_set()


def test_lease_keeper_redirect_loses_the_lease_as_redirect_and_halts_the_loop() -> None:
    signals, woken = Signals(), []
    signals.wake_with(lambda: woken.append(True))
    redirect = RedirectRefused(307, "POST", "/api/v1/agent/work/w-1/renew")
    keeper, _ = _keeper(FakeTime(), [redirect], signals)
    keeper.run()
    assert keeper.lost_code == "redirect" and signals.fatal is redirect and woken == [True]


class HookedPlane(ScriptedPlane):
    """A ``ScriptedPlane`` that calls ``hook`` (with the call's number) inside each lease call."""

    def __init__(self, clock: Callable[[], float], script: list[Answer], hook: Callable[[int], None]) -> None:
        super().__init__(clock, script)
        self._hook = hook

    def lease(self, work_id: str, action: str, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        self._hook(len(self.calls) + 1)
        return super().lease(work_id, action, body, identity)


def test_lease_keeper_renew_now_renews_at_once_instead_of_at_the_interval() -> None:
    time = FakeTime(now=1000.0)
    keeper, plane = _keeper(time, [_refused(409, "work_cancelled")])
    time.now = 1007.0
    keeper.renew_now()
    keeper.run()
    assert plane.calls == [(RENEW, 1007.0)] and time.waits == []
    assert keeper.lost_code == "work_cancelled"


def test_lease_keeper_renew_now_right_after_a_renewal_waits_the_least_gap() -> None:
    time = FakeTime(now=1000.0)
    keeper, plane = _keeper(time, [_refused(409, "work_cancelled")])
    keeper.renew_now()  # at the claim itself
    keeper.run()
    assert plane.calls == [(RENEW, 1000.0 + MIN_EARLY_RENEW_SECONDS)] and time.waits == [MIN_EARLY_RENEW_SECONDS]


def test_lease_keeper_renew_now_during_a_renewal_asks_for_one_more() -> None:
    time = FakeTime(now=1000.0)
    keeper: LeaseKeeper | None = None

    def hint(number: int) -> None:
        if number == 1:
            assert keeper is not None
            keeper.renew_now()  # a cancel hint while the first renewal is on the wire

    plane = HookedPlane(time.clock, [None, _refused(409, "work_cancelled")], hint)
    keeper = LeaseKeeper(plane, new_identity("https://cp.example"), LEASE, 20.0, Signals(), time.timing())
    keeper.run()
    assert plane.calls == [(RENEW, 1020.0), (RENEW, 1020.0 + MIN_EARLY_RENEW_SECONDS)]


def test_lease_keeper_many_hints_cost_one_renewal() -> None:
    time = FakeTime(now=1000.0)
    keeper, plane = _keeper(time, [_refused(409, "work_cancelled")])
    time.now = 1010.0
    for _ in range(100):
        keeper.renew_now()
    keeper.run()
    assert plane.calls == [(RENEW, 1010.0)]


def test_lease_keeper_stopped_after_a_hint_renews_nothing() -> None:
    time = FakeTime()
    keeper, plane = _keeper(time, [])
    keeper.renew_now()
    keeper.stop()
    keeper.run()
    assert plane.calls == []


# --- settling -----------------------------------------------------------------------------------


def _settler(time: FakeTime, script: list[Answer], signals: Signals | None = None) -> tuple[Settler, ScriptedPlane]:
    plane = ScriptedPlane(time.clock, script)
    return Settler(plane, new_identity("https://cp.example"), signals or Signals(), time.timing()), plane


def test_settle_accepted_at_once_answers_none() -> None:
    settler, plane = _settler(FakeTime(), [])
    assert settler.settle(LEASE, COMPLETE, {"epoch": 3}, expires_at=2000.0) is None
    assert [action for action, _ in plane.calls] == [COMPLETE]


def test_settle_backs_off_1_2_4_8_16_seconds_of_the_fake_clock_then_gives_up() -> None:
    time = FakeTime(now=1000.0)
    settler, plane = _settler(time, [_transient()] * 6)
    assert settler.settle(LEASE, FAIL, {"epoch": 3}, expires_at=5000.0) == UNSETTLED
    assert time.waits == list(SETTLE_BACKOFF)
    assert [at for _, at in plane.calls] == [1000.0, 1001.0, 1003.0, 1007.0, 1015.0, 1031.0]


def test_settle_never_waits_past_the_lease() -> None:
    time = FakeTime(now=1000.0)
    settler, plane = _settler(time, [_transient()] * 6)
    assert settler.settle(LEASE, COMPLETE, {"epoch": 3}, expires_at=1005.0) == UNSETTLED
    assert time.waits == [1.0, 2.0] and len(plane.calls) == 3


def test_settle_once_tries_a_single_time() -> None:
    time = FakeTime()
    settler, plane = _settler(time, [_transient()])
    assert settler.settle(LEASE, FAIL, {"epoch": 3}, expires_at=5000.0, once=True) == UNSETTLED
    assert len(plane.calls) == 1 and time.waits == []


def test_settle_recovers_after_a_transient_failure() -> None:
    time = FakeTime()
    settler, plane = _settler(time, [_transient(), None])
    assert settler.settle(LEASE, COMPLETE, {"epoch": 3}, expires_at=5000.0) is None
    assert time.waits == [1.0] and len(plane.calls) == 2


def test_settle_stopping_during_a_backoff_gives_up() -> None:
    signals = Signals()
    signals.close()
    time = FakeTime()
    settler, plane = _settler(time, [_transient()], signals)
    assert settler.settle(LEASE, COMPLETE, {"epoch": 3}, expires_at=5000.0) == UNSETTLED
    assert len(plane.calls) == 1 and time.waits == []


def test_settle_refusal_answers_its_code_without_halting() -> None:
    signals = Signals()
    settler, _ = _settler(FakeTime(), [_refused(409, "result_missing")], signals)
    assert settler.settle(LEASE, COMPLETE, {"epoch": 3}, expires_at=5000.0) == "result_missing"
    assert signals.fatal is None and not signals.stopping()


def test_settle_refused_credential_answers_its_code_and_halts() -> None:
    signals, refused = Signals(), _refused(401, "credential_invalid")
    settler, _ = _settler(FakeTime(), [refused], signals)
    assert settler.settle(LEASE, FAIL, {"epoch": 3}, expires_at=5000.0) == "credential_invalid"
    assert signals.fatal is refused and signals.stopping()


def test_settle_redirect_answers_redirect_and_halts() -> None:
    signals, redirect = Signals(), RedirectRefused(308, "POST", "/api/v1/agent/work/w-1/complete")
    settler, _ = _settler(FakeTime(), [redirect], signals)
    assert settler.settle(LEASE, COMPLETE, {"epoch": 3}, expires_at=5000.0) == "redirect"
    assert signals.fatal is redirect


# --- signals ------------------------------------------------------------------------------------


def test_signals_halt_keeps_the_first_fatal_failure() -> None:
    signals = Signals()
    first, second = RuntimeError("first"), RuntimeError("second")
    signals.halt(first)
    signals.halt(second)
    assert signals.fatal is first and signals.stopping()


# --- one job -------------------------------------------------------------------------------------


class AdvancingPlane(ScriptedPlane):
    """Each lease call takes ``seconds`` of fake time."""

    def __init__(self, time: FakeTime, seconds: float) -> None:
        super().__init__(time.clock, [])
        self._time, self._seconds = time, seconds
        self.bodies: list[dict[str, Any]] = []

    def lease(self, work_id: str, action: str, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        self.bodies.append(body)
        answer = super().lease(work_id, action, body, identity)
        self._time.now += self._seconds
        return answer


def test_job_for_a_capability_the_worker_does_not_offer_fails_it_and_times_itself_on_the_injected_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = StillTime(now=1000.0)
    plane = AdvancingPlane(time, 2.5)
    worker = WorkerClient("unix:///nonexistent/worker.sock")
    view = WorkerView(worker)
    station = Station(
        plane,
        worker,
        PresignedObjects(requests.Session(), 1.0),
        view,
        Signals(),
        time.timing(),
        renew_interval=lambda lease_seconds: 20.0,
        poll_seconds=0.05,
    )
    job = Job(station, LEASE, new_identity("https://cp.example"))
    with caplog.at_level(logging.INFO, logger="modelforge.agent"):
        keep_draining = job.run()
    assert keep_draining is False and job.outcome == "failed" and view.stale
    assert plane.calls == [(FAIL, 1000.0)] and plane.bodies[0]["retryable"] is True
    assert plane.bodies[0]["reason"].startswith("capability_unavailable")
    finished = [record for record in caplog.records if getattr(record, "event", None) == "work_finished"]
    assert len(finished) == 1 and getattr(finished[0], "duration_ms", None) == 2500.0
    assert getattr(finished[0], "renewals", None) == 0


# --- a lease lost while the worker runs the job ----------------------------------------------------

SLEEP_LEASE = Lease("w-1", "diagnostic.sleep", 3, 60, "https://objects.example/in", "https://objects.example/out")


class ScriptedWorker(WorkerClient):
    """A runtime worker in this process: ``run`` holds until the job is cancelled (then 409
    ``job_cancelled``) or ``released``; ``cancels``: whether its status lists the feature."""

    def __init__(self, cancels: bool) -> None:
        super().__init__("unix:///nonexistent/worker.sock")
        self._features = frozenset({"cancel"}) if cancels else frozenset()
        self.runs: list[tuple[str, dict[str, Any], str | None]] = []
        #: the GPU each run named (None: a slot not tied to a GPU)
        self.gpus: list[str | None] = []
        self.cancelled: list[str] = []
        self.started = threading.Event()
        self.released = threading.Event()

    def status(self) -> WorkerStatus:
        capability = WorkerCapability("diagnostic.sleep", True, None)
        return WorkerStatus(OK, "ok", (capability,), healthy=True, features=self._features)

    def run(
        self,
        capability: str,
        payload: dict[str, Any],
        cutter: Any = None,
        job_id: str | None = None,
        gpu_uuid: Any = None,
    ) -> Any:
        self.runs.append((capability, payload, job_id))
        self.gpus.append(gpu_uuid)
        self.started.set()
        assert self.released.wait(10), "a test never released its worker"
        if job_id in self.cancelled:
            raise WorkerRefused(409, "job_cancelled", f"job {job_id} was cancelled", True)
        return {"slept_seconds": 60}

    def cancel(self, job_id: str) -> str:
        self.cancelled.append(job_id)
        self.released.set()
        return "ended"


class StoredObjects(PresignedObjects):
    def __init__(self) -> None:
        super().__init__(requests.Session(), 1.0)
        self.puts: list[bytes] = []

    def get(self, url: str, what: str, max_bytes: int) -> bytes:
        return b'{"seconds":60}'

    def put(self, url: str, what: str, data: bytes) -> None:
        self.puts.append(data)


def _lost_while_running(worker: ScriptedWorker, code: str) -> tuple[Job, HookedPlane, StoredObjects]:
    """One job whose first renewal (once the worker runs it) answers 409 ``code``."""
    time = FakeTime(now=1000.0)
    plane = HookedPlane(time.clock, [_refused(409, code)], lambda number: worker.started.wait(10))
    objects = StoredObjects()
    view = WorkerView(worker)
    view.observe()
    station = Station(
        plane, worker, objects, view, Signals(), time.timing(), renew_interval=lambda lease: 20.0, poll_seconds=0.05
    )
    return Job(station, SLEEP_LEASE, new_identity("https://cp.example")), plane, objects


@pytest.mark.parametrize("code", ["work_cancelled", "lease_lost"])
def test_job_lease_lost_cancels_the_job_on_a_worker_that_can_and_settles_nothing(
    code: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker = ScriptedWorker(cancels=True)
    job, plane, objects = _lost_while_running(worker, code)
    with caplog.at_level(logging.INFO, logger="modelforge.agent"):
        keep_draining = job.run()
    assert keep_draining is True and job.outcome == code
    assert [job_id for _, _, job_id in worker.runs] == ["w-1:3"] and worker.cancelled == ["w-1:3"]
    assert [action for action, _ in plane.calls] == [RENEW]  # no fail, no complete
    assert objects.puts == []
    assert job.abandoned is not None and job.abandoned.done.wait(5)  # the worker answered: it is free
    cancelled = [record for record in caplog.records if getattr(record, "event", None) == "work_job_cancelled"]
    assert len(cancelled) == 1 and getattr(cancelled[0], "state", None) == "ended"
    assert getattr(cancelled[0], "why", None) == code


def test_job_lease_lost_on_a_worker_without_cancel_only_stops_waiting() -> None:
    worker = ScriptedWorker(cancels=False)
    job, plane, objects = _lost_while_running(worker, "work_cancelled")
    try:
        assert job.run() is True and job.outcome == "work_cancelled"
        assert [job_id for _, _, job_id in worker.runs] == [None] and worker.cancelled == []
        assert [action for action, _ in plane.calls] == [RENEW] and objects.puts == []
        assert job.abandoned is not None and not job.abandoned.done.is_set()  # the worker is still on it
    finally:
        worker.released.set()
    assert job.abandoned.done.wait(5)


# --- node faults: a busy worker is the node's fault, not the item's ---------------------------------


def _run_failed_with(error: WorkerRefused) -> Any:
    from modelforge_node_agent.work.run import RunCall

    call = RunCall(WorkerClient("unix:///nonexistent/worker.sock"), "diagnostic.echo", {})
    call.error = error
    return call.failure()


def test_a_busy_worker_fails_the_work_as_a_node_fault_only_where_the_control_plane_lists_it() -> None:
    from modelforge_protocol.schemas import FEATURE_NODE_FAULT

    lease = LEASE
    busy = _run_failed_with(WorkerRefused(503, "worker_busy", "all 2 slots are running jobs", True))
    assert busy.node_fault is True and busy.retryable is True
    assert busy.fail_body(lease, frozenset({FEATURE_NODE_FAULT}))["node_fault"] is True
    assert "node_fault" not in busy.fail_body(lease, frozenset())  # an older control plane: as before
    timeout = _run_failed_with(WorkerRefused(504, "job_timeout", "the job ran over 120 s", True))
    assert timeout.node_fault is False  # the item may be at fault: it counts
    assert "node_fault" not in timeout.fail_body(lease, frozenset({FEATURE_NODE_FAULT}))


# --- a GPU that faults while it runs the job ---------------------------------------------------

GPU = "GPU-5e1a0000-0000-4000-8000-000000000002"


class BodyPlane(ScriptedPlane):
    """A ``ScriptedPlane`` that keeps each lease call's body."""

    def __init__(self, clock: Callable[[], float], script: list[Answer]) -> None:
        super().__init__(clock, script)
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    def lease(self, work_id: str, action: str, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        self.bodies.append((action, body))
        return super().lease(work_id, action, body, identity)


def test_a_gpu_that_faults_mid_job_stops_the_job_and_fails_it_as_the_nodes_fault() -> None:
    worker = ScriptedWorker(cancels=True)
    time = FakeTime(now=1000.0)
    plane = BodyPlane(time.clock, [])
    view = WorkerView(worker)
    view.observe()
    signals = Signals()
    signals.features = frozenset({"node_fault"})

    def faults() -> set[str]:  # the event thread saw an Xid 79 on the job's GPU once it ran
        return {GPU} if worker.started.is_set() else set()

    station = Station(
        plane, worker, StoredObjects(), view, signals, time.timing(), lambda lease: 20.0, 0.05, gpu_faults=faults
    )
    job = Job(station, SLEEP_LEASE, new_identity("https://cp.example"), gpu_uuid=GPU)
    job.run()
    assert job.outcome == "failed"
    assert worker.gpus == [GPU] and worker.cancelled == ["w-1:3"]  # it ran on its GPU, and was stopped
    ((action, body),) = [(action, body) for action, body in plane.bodies if action == FAIL]
    assert body["node_fault"] is True and body["retryable"] is True and body["reason"].startswith("gpu_fault: ")


def test_a_fault_on_another_gpu_leaves_the_job_alone() -> None:
    worker = ScriptedWorker(cancels=True)
    time = FakeTime(now=1000.0)
    plane = BodyPlane(time.clock, [])
    view = WorkerView(worker)
    view.observe()

    def faults() -> set[str]:
        if worker.started.is_set():
            worker.released.set()  # the job ends normally
        return {"GPU-5e1a0000-0000-4000-8000-000000000009"}

    station = Station(plane, worker, StoredObjects(), view, Signals(), time.timing(), lambda lease: 20.0, 0.05, faults)
    job = Job(station, SLEEP_LEASE, new_identity("https://cp.example"), gpu_uuid=GPU)
    job.run()
    assert worker.cancelled == [] and [action for action, _ in plane.bodies][-1] == COMPLETE
