"""One token, sixty agents at once: the database decides the single winner, never timing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import ADMIN_TOKEN
from tests.support.api import ControlPlane
from tests.support.processes import start_unserialised_local_up
from tests.support.race import enrollment_round

ROUNDS = int(os.environ.get("MODELFORGE_RACE_ROUNDS", "20"))
#: Rounds allowed to observe a double winner without the lock (it is usually seen in the first few).
UNSERIALISED_MAX_ROUNDS = 20
#: One round of 60 enrollments takes up to ~30 s on 2 busy cores: the budget fits every round.
ROUND_BUDGET_SECONDS = 30


@pytest.mark.slow
def test_sixty_concurrent_enrollments_with_one_token_make_exactly_one_node_every_round(remote: ControlPlane) -> None:
    for round_number in range(ROUNDS):
        result = enrollment_round(remote, attempts=60)
        assert result.exactly_one_winner, f"round {round_number}: {result}"
        # every loser was told the token is consumed: no resets, no 5xx
        assert result.statuses == {201: 1, 409: 59}, f"round {round_number}: {result}"
        assert result.enrollment_status == "consumed"


@pytest.mark.slow
@pytest.mark.timeout(60 + UNSERIALISED_MAX_ROUNDS * ROUND_BUDGET_SECONDS)
def test_race_test_catches_an_emulator_that_is_not_atomic(tmp_path: Path) -> None:
    """Without the emulator's request lock, moto lets two callers pass one condition.

    The same round as above must then see a double winner (two 201s or two nodes for one token;
    a round in which every request failed proves nothing); if it never did, the race test above
    would prove nothing.
    """
    with start_unserialised_local_up(tmp_path / "unserialised.log", {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as running:
        cp = ControlPlane(running.api_url, ADMIN_TOKEN)
        results = []
        for _ in range(UNSERIALISED_MAX_ROUNDS):
            results.append(enrollment_round(cp, attempts=60))
            if results[-1].double_winner:
                break
    print(f"non-atomic emulator: double winner seen in round {len(results)}: {results[-1]}")
    assert results[-1].double_winner, (
        f"{len(results)} rounds against a non-atomic emulator all had one winner: {results[-1]}"
    )
