"""Heartbeats are cheap: one DynamoDB request each in steady state, no S3 write, no log event."""

from __future__ import annotations

from modelforge_local_stack.emulator import operations_delta

from tests.support.api import ControlPlane


def _app_operations(stack) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {name: count for name, count in stack.aws_operations().items() if not name.startswith("poller:")}


def test_steady_state_heartbeat_makes_exactly_one_update_item_and_no_s3_call(counted_stack, cp: ControlPlane) -> None:
    stack = counted_stack
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity, gpus=8).status_code == 200  # pending -> online (a logged transition)
    stack.drain_state_log()
    before = _app_operations(stack)
    for _ in range(25):
        response = cp.heartbeat(identity, gpus=8)
        assert response.status_code == 200, response.text
    delta = operations_delta(before, _app_operations(stack))
    assert delta == {"UpdateItem": 25}


def test_steady_state_heartbeats_write_nothing_to_the_state_log(counted_stack, cp: ControlPlane) -> None:
    stack = counted_stack
    identity = cp.enrolled_node()
    cp.heartbeat(identity)
    stack.drain_state_log()
    for _ in range(5):
        cp.heartbeat(identity)
    assert stack.drain_state_log() == 0


def test_first_heartbeat_is_a_logged_transition_to_online(counted_stack, cp: ControlPlane) -> None:
    stack = counted_stack
    identity = cp.enrolled_node()
    stack.drain_state_log()
    before = _app_operations(stack)
    response = cp.heartbeat(identity)
    assert response.status_code == 200 and response.json()["status"] == "online"
    stack.drain_state_log()  # waits for a background poll in flight, then ships what is left
    delta = operations_delta(before, _app_operations(stack))
    # the state-log function's one S3 write (background poller or the drain): not the heartbeat's
    shipped = delta.pop("S3:PUT", 0)
    # a caller this instance has not verified is read first; the read shows the node pending, so
    # the transition (update + event in one transaction) follows, and nothing else
    assert delta == {"GetItem": 1, "TransactWriteItems": 1}
    assert shipped == 1
