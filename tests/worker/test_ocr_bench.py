"""bench/ocr.py works: a short run against a real worker prints the figures."""

from __future__ import annotations

import pytest

from tests.support import bench_scripts


def test_the_ocr_bench_prints_rate_and_latency() -> None:
    ran = bench_scripts.run("ocr", "--images", "1", "--warmup", "0", "--seconds", "30")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout
    assert "device  images  seconds  images/s   p50 ms   p99 ms  worker p50 ms" in out
    assert "\ncpu          1" in out
    assert "worker exited with code 0" in out


@pytest.mark.parametrize("argv", [["--images", "0"], ["--seconds", "nan"], ["--warmup", "21"], ["--lines", "41"]])
def test_the_ocr_bench_validates_its_options(argv: list[str]) -> None:
    ran = bench_scripts.run("ocr", *argv, timeout=60)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "error:" in ran.stderr
