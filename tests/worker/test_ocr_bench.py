"""bench/ocr.py works: a short run against a real worker prints the figures."""

from __future__ import annotations

import pytest

from tests.support import bench_scripts


def test_the_ocr_bench_prints_rate_and_latency(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_scripts.load("ocr").main(["--images", "1", "--warmup", "0", "--seconds", "30"]) == 0
    out = capsys.readouterr().out
    assert "device  images  seconds  images/s   p50 ms   p99 ms  worker p50 ms" in out
    assert "\ncpu          1" in out
    assert "worker exited with code 0" in out


@pytest.mark.parametrize("argv", [["--images", "0"], ["--seconds", "nan"], ["--warmup", "21"], ["--lines", "41"]])
def test_the_ocr_bench_validates_its_options(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_scripts.load("ocr").main(argv)
    assert exited.value.code == 2
