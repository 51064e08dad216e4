"""Real pipeline processes for tests: the built Collector, Jaeger v2 and sink processes on loopback.

Binaries come from ``scripts/build_pipeline.py`` (built once, then cached). Every process is
started with ephemeral ports, waited for through a real health endpoint, and killed with its
process group at the end of the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .conftest import ROOT, free_port

CONFIGS = ROOT / "collector-config"


def build_binaries() -> dict[str, str]:
    """``scripts/build_pipeline.py``: cached binaries at once, a first build in minutes (bounded)."""
    print("\nrankscope tests: building or finding the Collector and Jaeger binaries", file=sys.stderr, flush=True)
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_pipeline.py")],
        stdout=subprocess.PIPE,
        stderr=None,  # the build's progress lines go to the test log as they happen
        text=True,
        timeout=3000,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError("building the pipeline binaries failed (see the output above)")
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def wait_http(url: str, timeout: float = 60.0, proc: Process | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.proc.poll() is not None:
            tail = "\n".join(proc.text().splitlines()[-15:])
            raise RuntimeError(f"process exited with {proc.proc.returncode} before {url} answered:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


class Process:
    """A started child process (own process group) and the log file it writes."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._file = log.open("w")
        self.proc = subprocess.Popen(
            command, env=env, stdout=self._file, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._file.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without rankscope's and OTel's variables, plus ``extra``.
    Processes a test starts with one experiment's env are one job: they share a run id, as the
    launcher of a job started apart would give them (``docs/runs.md``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    env.update(extra)
    if "RANKSCOPE_EXPERIMENT" in extra:
        env.setdefault("RANKSCOPE_RUN_ID", f"job-{extra['RANKSCOPE_EXPERIMENT']}")
    return env


def run_worker(
    script: str, *args: str, env: dict[str, str], cwd: Path, timeout: float = 200
) -> subprocess.CompletedProcess[str]:
    """``tests/workers/SCRIPT ARGS`` in a fresh interpreter, which must succeed."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "workers" / script), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def last_json(done: subprocess.CompletedProcess[str]) -> Any:
    """What a worker printed as JSON on its last line."""
    return json.loads(done.stdout.strip().splitlines()[-1])


def console_step_times(text: str) -> dict[int, float]:
    """Each step's time in seconds as a console printed it (``step N  ... | time 405.2ms``, a line
    each: a wide ``COLUMNS``)."""
    times = re.findall(r"^step (\d+) .*\| time ([\d.]+)(us|ms|s)\b", text, re.M)
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    return {int(step): float(value) * scale[unit] for step, value, unit in times}


def jsonl_views(directory: Path) -> dict[str, Any]:
    """A sink's two JSONL views: ``global.jsonl`` (the cross-process view) and ``ranks.jsonl``
    (each process's own reduction)."""
    return {
        "global": {"backend": "jsonl", "logging_mode": "global_reduce", "path": str(directory / "global.jsonl")},
        "per_rank": {"backend": "jsonl", "logging_mode": "per_rank_reduce", "path": str(directory / "ranks.jsonl")},
    }


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@contextmanager
def collector(binary: str, config: str, tmp: Path, name: str = "", **env: str) -> Iterator[dict[str, Any]]:
    """The built Collector running ``collector-config/<config>.yaml`` on loopback ports; ``name``
    (default: the config's) names its queue directory and log, so several can share ``tmp``."""
    name = name or config
    grpc, http, health = free_port(), free_port(), free_port()
    process = Process(
        [binary, "--config", str(CONFIGS / f"{config}.yaml")],
        clean_env(
            **{
                "OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
                "OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http}",
                "HEALTH_CHECK_ENDPOINT": f"127.0.0.1:{health}",
                "QUEUE_DIRECTORY": str(tmp / f"{name}-queue"),
                **env,  # the test's own choices win (e.g. a port picked before the Collector starts)
            }
        ),
        tmp / f"{name}.log" if not (tmp / f"{name}.log").exists() else tmp / f"{name}-{time.monotonic_ns()}.log",
    )
    try:
        wait_http(f"http://127.0.0.1:{health}/", proc=process)
        endpoint = env.get("OTLP_GRPC_ENDPOINT", f"127.0.0.1:{grpc}")
        yield {"endpoint": endpoint, "http": f"127.0.0.1:{http}", "process": process}
    finally:
        process.stop()


@contextmanager
def jaeger(binary: str, tmp: Path) -> Iterator[dict[str, Any]]:
    """Jaeger v2 with ``collector-config/jaeger.yaml``: OTLP in, query API out."""
    otlp, query = free_port(), free_port()
    process = Process(
        [binary, "--config", str(CONFIGS / "jaeger.yaml")],
        clean_env(
            JAEGER_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{otlp}",
            JAEGER_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{free_port()}",
            JAEGER_QUERY_HTTP_ENDPOINT=f"127.0.0.1:{query}",
            JAEGER_QUERY_GRPC_ENDPOINT=f"127.0.0.1:{free_port()}",
        ),
        tmp / "jaeger.log",
    )
    try:
        wait_http(f"http://127.0.0.1:{query}/api/services", proc=process)
        yield {"otlp": f"127.0.0.1:{otlp}", "query": f"http://127.0.0.1:{query}", "process": process}
    finally:
        process.stop()
    # Its query service traces nothing of its own: those traces would go to localhost:4317, where
    # a sink or a Collector of the machine listens (``enable_tracing: false``).
    said = (tmp / "jaeger.log").read_text(errors="replace")
    assert not re.search(r"(localhost|127\.0\.0\.1|\[::1\]):4317", said), said[-2000:]


def start_sink(tmp: Path, name: str, backends: dict[str, Any], grpc: int, http: int, grace: float = 3.0) -> Process:
    """``rankscope sink`` as its own process (so a test can kill and restart it on the same ports)."""
    command = [sys.executable, "-m", "rankscope.cli", "sink", "--grpc-port", str(grpc), "--http-port", str(http)]
    command += ["--backends", json.dumps(backends), "--grace", str(grace), "--state-dir", str(tmp / f"{name}-state")]
    log = tmp / f"{name}.log"
    if log.exists():  # a restart appends its log after the first life's
        log = tmp / f"{name}-{time.monotonic_ns()}.log"
    process = Process(command, clean_env(WANDB_MODE="offline", WANDB_SILENT="true"), log)
    wait_http(f"http://127.0.0.1:{http}/healthz", proc=process)
    return process


def run_workers(commands: list[tuple[list[str], dict[str, str]]], timeout: float = 240) -> list[str]:
    procs = [
        subprocess.Popen(c, env=e, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c, e in commands
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        outs.append(out + err)
    return outs


def sink_status(http: int, experiment: str) -> dict[str, Any]:
    """The sink's status of an experiment; {} while it has seen nothing of it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/rankscope/v1/status?experiment={experiment}") as r:
            return json.loads(r.read())  # type: ignore[no-any-return]
    except OSError:
        return {}


def wait_until_settled(
    http: int,
    experiment: str,
    last_step: int,
    quiet: float = 5.0,
    timeout: float = 90,
    status_of: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Until the sink wrote ``last_step`` and nothing (late data included) changed for ``quiet`` seconds,
    longer than the Collectors' longest retry interval. ``status_of``: how to ask the sink's status
    where the test cannot reach its port (a sink in a network namespace)."""
    deadline = time.monotonic() + timeout
    seen, since = None, time.monotonic()
    while time.monotonic() < deadline:
        status = status_of() if status_of is not None else sink_status(http, experiment)
        state = (status.get("last_written_step"), status.get("late_points"), status.get("spans_stored"))
        if state != seen:
            seen, since = state, time.monotonic()
        elif (status.get("last_written_step") or -1) >= last_step and time.monotonic() - since >= quiet:
            return
        time.sleep(0.25)
    raise AssertionError(f"the sink did not settle: {seen}")


def jsonl_view(directory: Path) -> dict[str, Any]:
    return {"jsonl": {"logging_mode": "global_reduce", "path": str(directory / "{experiment}.jsonl")}}


def sink_rows(directory: Path) -> dict[str, dict[int, dict[str, float]]]:
    """{experiment: {step: {key: value}}} from a sink's JSONL files."""
    found: dict[str, dict[int, dict[str, float]]] = {}
    for path in directory.glob("*.jsonl"):
        for row in map(json.loads, path.read_text().splitlines()):
            found.setdefault(row["experiment"], {}).setdefault(row["step"], {})[row["key"]] = row["value"]
    return found
