"""bench/ocr.py works: a short run against a real worker prints the figures."""

from __future__ import annotations

import pytest

from tests.support import bench_scripts


def test_the_ocr_bench_prints_rate_and_latency_for_each_slot_count() -> None:
    ran = bench_scripts.run("ocr", "--images", "2", "--warmup", "0", "--seconds", "30", "--slots", "2")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout
    assert "device  slots images  seconds  images/s   p50 ms   p99 ms  worker p50 ms" in out
    assert "\ncpu         1      2" in out and "\ncpu         2      2" in out
    assert out.count("worker exited with code 0") == 2


@pytest.mark.parametrize(
    "argv", [["--images", "0"], ["--seconds", "nan"], ["--warmup", "21"], ["--lines", "41"], ["--slots", "9"]]
)
def test_the_ocr_bench_validates_its_options(argv: list[str]) -> None:
    ran = bench_scripts.run("ocr", *argv, timeout=60)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "error:" in ran.stderr
