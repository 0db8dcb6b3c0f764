"""Entry point: ``python3 -m modelforge_node_agent.main [--preflight [--json]]``.

Order on every start: the whole configuration, including "no identity and no enrollment token"
(exit 2, before anything is created or probed), state volume (exit 4), NVIDIA preflight (exit 3),
then enrollment and publishing. SIGTERM/SIGINT stop cleanly with exit 0 within 2 seconds. Exit
codes and messages come from ``exit_codes.exit_for``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from modelforge_logging import jsonlog
from modelforge_protocol import environment

from . import AGENT_VERSION, channel, exit_codes
from .agent import Agent
from .config import INSECURE_SWITCH, AgentConfig, load_config, load_preflight_config, log_format_of
from .control_plane import ControlPlaneClient
from .failures import ConfigurationInvalid
from .gpu import GpuHealthProbe, GpuProbe, PynvmlProbe
from .gpu_source import NoGpus, NvidiaGpus, open_gpus
from .gpu_watch import GpuWatch, read_boot_id
from .identity import StateVolume, root_filesystem_warning
from .nvml_simulation import ScriptedProbe
from .preflight import PreflightFailed, run_preflight
from .transport import base_url, build_session
from .work import for_config

log = logging.getLogger("modelforge.agent")
#: How long a stop waits for the publishing thread before exiting anyway (the spec allows 2 s).
STOP_GRACE_SECONDS = 1.5
#: How often the main thread wakes to run signal handlers (a quarter second, negligible CPU).
SIGNAL_CHECK_SECONDS = 0.25


def _warn_about_environment(config: AgentConfig) -> None:
    if not config.tls_verify:
        log.warning(
            f"TLS VERIFICATION IS OFF ({INSECURE_SWITCH}): this agent trusts any server. Development only; "
            "use MODELFORGE_AGENT_CA_CERT_PATH for a private CA",
            extra={"event": "tls_verification_disabled"},
        )
    warning = root_filesystem_warning(config.state_volume)
    if warning:
        log.warning(warning, extra={"event": "state_volume_not_durable", "path": str(config.state_volume)})


def _simulated(scenario: Path) -> Callable[[], GpuProbe]:
    """The scripted NVML fake of ``MODELFORGE_AGENT_NVML_SIMULATION`` (allowed: config checked it)."""
    log.warning(
        f"SIMULATED GPUS: this agent runs against the NVML simulation {scenario}, not the host's GPUs; "
        "its inventory says simulated: true",
        extra={"event": "nvml_simulated", "scenario": str(scenario)},
    )
    return lambda: ScriptedProbe(scenario)


def gpu_watch_of(gpus: NvidiaGpus | NoGpus, timeout_seconds: float) -> GpuWatch:
    """Per-GPU health through the preflight's NVML session (a CPU node: its boot id only)."""
    if isinstance(gpus, NvidiaGpus) and isinstance(gpus.probe, GpuHealthProbe):
        return GpuWatch(gpus.probe, gpus.devices(), timeout_seconds, boot_id=read_boot_id())
    return GpuWatch(None, [], timeout_seconds, boot_id=read_boot_id())


def run_agent(
    config: AgentConfig,
    *,
    probe_factory: Callable[[], GpuProbe] = PynvmlProbe,
    stop: threading.Event | None = None,
) -> int:
    """Run a validated configuration until stopped (0) or a fatal error (its exit code)."""
    stop = stop or threading.Event()
    state = StateVolume(config.state_volume)
    try:
        state.prepare()
        _warn_about_environment(config)
        if config.nvml_simulation is not None:
            probe_factory = _simulated(config.nvml_simulation)
        gpus = open_gpus(config.accelerator_mode, probe_factory, config.preflight_timeout_seconds)
        client = ControlPlaneClient(build_session(config), base_url(config), config.request_timeout_seconds)
        work = for_config(config) if config.worker_url is not None else None
        push = channel.for_config(config)
        agent = Agent(
            config,
            client,
            state,
            gpus,
            stop=stop,
            clock=time.monotonic,
            jitter=random.random,
            work=work,
            channel=push,
            gpu_watch=gpu_watch_of(gpus, config.preflight_timeout_seconds),
        )
    except Exception as fatal:
        return exit_codes.report(fatal)
    outcome: list[int] = []
    done = threading.Event()

    def publish() -> None:
        try:
            agent.run()
            outcome.append(exit_codes.OK)
        except Exception as fatal:
            outcome.append(exit_codes.report(fatal))
        finally:
            done.set()
            stop.set()  # wakes the main thread, which sleeps on ``stop`` alone

    threading.Thread(target=publish, name="publisher", daemon=True).start()
    try:
        # A timed wait: a signal may land on the publisher thread, and Python runs handlers only
        # when the main thread runs; an untimed wait could then sleep through SIGTERM.
        while not stop.wait(SIGNAL_CHECK_SECONDS):
            pass
        done.wait(STOP_GRACE_SECONDS)
        if outcome and outcome[0] != exit_codes.OK:
            return outcome[0]
        log.info("stopped", extra={"event": "agent_stopped"})
        return exit_codes.OK
    finally:
        if done.is_set():  # never release NVML under a publisher that is still using it
            gpus.close()


def start(
    env: Mapping[str, str],
    *,
    probe_factory: Callable[[], GpuProbe] = PynvmlProbe,
    stop: threading.Event | None = None,
) -> int:
    """Validate the whole configuration, then run the agent; nothing is touched before it is valid.
    A ``MODELFORGE_*`` variable no part of ModelForge reads gets one warning line first (a
    misspelled name is often why a setting is missing)."""
    for name, warning in environment.unknown_variable_warnings(env):
        log.warning(warning, extra={"event": "unknown_setting", "variable": name})
    try:
        config = load_config(env)
    except ConfigurationInvalid as invalid:
        return exit_codes.report(invalid)
    jsonlog.configure(config.log_level, fmt=config.log_format)
    return run_agent(config, probe_factory=probe_factory, stop=stop)


def run_preflight_only(
    env: Mapping[str, str], as_json: bool, probe_factory: Callable[[], GpuProbe] = PynvmlProbe
) -> int:
    """The bounded diagnostic: never enrolls, never touches the network or the state volume."""
    try:
        mode, timeout = load_preflight_config(env)
        result = run_preflight(mode, probe_factory, timeout_seconds=timeout)
    except ConfigurationInvalid as invalid:
        print(invalid.message, file=sys.stderr)
        return exit_codes.exit_for(invalid).code
    except PreflightFailed as failure:
        if as_json:
            print(json.dumps({"ok": False, "code": failure.code, "cause": failure.cause}))
        else:
            print(f"{failure.code}: {failure.cause}", file=sys.stderr)
        return exit_codes.exit_for(failure).code
    print(json.dumps({"ok": True, **result.to_wire()}, indent=2) if as_json else result.as_text())
    return exit_codes.OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelforge-node-agent", description="ModelForge node agent")
    parser.add_argument(
        "--preflight", action="store_true", help="run only the NVIDIA preflight and print the inventory"
    )
    parser.add_argument("--json", action="store_true", help="with --preflight: print JSON")
    parser.add_argument("--version", action="version", version=f"modelforge-node-agent {AGENT_VERSION}")
    args = parser.parse_args(argv)
    env = os.environ
    # until the configuration is validated (which names a bad format): the format asked for, else json
    jsonlog.configure(env.get("MODELFORGE_AGENT_LOG_LEVEL", "INFO").upper(), fmt=log_format_of(env) or "json")
    if args.preflight:
        return run_preflight_only(env, args.json)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return start(env, stop=stop)


if __name__ == "__main__":
    sys.exit(main())
