"""bench/dispatch.py as a developer runs it: its options are bounded, and a short run with the
channel prints its figures."""

from __future__ import annotations

import pytest

from tests.support import bench_scripts


@pytest.mark.parametrize("args", [("--submits", "0"), ("--gap", "0"), ("--phase", "-1"), ("--modes", "carrier-pigeon")])
def test_dispatch_bench_refuses_options_out_of_bounds(args: tuple[str, ...]) -> None:
    done = bench_scripts.run("dispatch", *args, timeout=60)
    assert done.returncode == 2 and args[0] in done.stderr


@pytest.mark.slow
def test_dispatch_bench_runs_a_few_items_over_the_channel_and_prints_its_figures() -> None:
    done = bench_scripts.run(
        "dispatch", "--submits", "2", "--gap", "0.5", "--phase", "0", "--modes", "channel", timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "channel: 2 diagnostic.echo items, node channel connected" in done.stdout
    assert "submit -> claimed" in done.stdout and "submit -> succeeded" in done.stdout
    assert "target submit -> claimed p50 <= 0.5 s, p99 <= 1.5 s:" in done.stdout
