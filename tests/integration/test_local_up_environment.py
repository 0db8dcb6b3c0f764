"""`modelforge local up` warns once per MODELFORGE_* variable no part of ModelForge reads, then
goes on as usual (here to refusing a half TLS pair, which needs no port or emulator)."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import local_up_command, run_to_exit


def test_local_up_unknown_and_misspelled_variables_warn_one_line_each_then_it_goes_on(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("not used")
    done = run_to_exit(
        local_up_command("--tls-cert", str(cert)),
        {"MODELFORGE_BANANA": "1", "MODELFORGE_SWEEP_INTERVAL_SECOND": "5"},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "modelforge: warning: MODELFORGE_BANANA is not a ModelForge setting and is ignored",
        "modelforge: warning: MODELFORGE_SWEEP_INTERVAL_SECOND is not a ModelForge setting and is ignored "
        "(did you mean MODELFORGE_SWEEP_INTERVAL_SECONDS?)",
        "modelforge: --tls-cert and --tls-key must be given together",
    ]
