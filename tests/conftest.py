from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import rankscope as rs
from rankscope.core import errors as rs_errors
from rankscope.core import runtime as rs_slot
from rankscope.sink import Sink, SinkConfig

from .otlp_receiver import GrpcReceiver, HttpReceiver

ROOT = Path(__file__).resolve().parent.parent
_ENV_PREFIXES = ("RANKSCOPE_", "OTEL_", "TORCHELASTIC_", "SLURM_")
_ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def clean_rankscope(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts unconfigured, with no launcher variables, and must cause no internal error."""
    for name in list(os.environ):
        if name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES:
            monkeypatch.delenv(name)
    rs.shutdown()
    rs_slot.install(None)
    rs_errors.internal_errors.clear()
    yield
    rs.shutdown()
    rs_slot.install(None)
    assert rs_errors.internal_errors == [], rs_errors.internal_errors


@pytest.fixture
def receiver() -> Iterator[GrpcReceiver]:
    r = GrpcReceiver()
    yield r
    rs.shutdown()  # before the receiver goes away, so the last export has somewhere to go
    r.close()


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    r = HttpReceiver()
    yield r
    rs.shutdown()
    r.close()


_given_ports: set[int] = set()


def free_port() -> int:
    """A loopback port no other process holds, never handed out twice in this test session.

    Chosen below the kernel's ephemeral range (32768+), so an outgoing connection of a process
    started meanwhile cannot take it before the server that was given it binds it (a port from
    ``bind(0)`` can be, and once was: the Collector exited with "address already in use")."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        port = rng.randrange(20_000, 32_000)
        if port in _given_ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given_ports.add(port)
        return port
    raise RuntimeError("no free loopback port in 20000-31999")


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter (a clean process: env is read once per process)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


@pytest.fixture
def make_sink() -> Iterator[Callable[..., Sink]]:
    """Start real sinks on ephemeral loopback ports; stopped (and checked) after the test."""
    started: list[Sink] = []

    def make(**config: Any) -> Sink:
        config.setdefault("grpc_port", 0)
        config.setdefault("http_port", 0)
        sink = Sink(SinkConfig(**config)).start()
        started.append(sink)
        return sink

    yield make
    rs.shutdown()
    for sink in started:
        sink.stop()
        assert sink.internal_errors == [], sink.internal_errors


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` run where CUDA is (``pytest -m gpu`` on a GPU machine) and skip elsewhere."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            for item in gpu:
                item.add_marker(pytest.mark.skip(reason="needs CUDA (marked gpu)"))


MYPY_TEST = "tests/integration/test_lint_and_examples.py::test_mypy_clean"
_mypy_run = pytest.StashKey[tuple["subprocess.Popen[bytes]", Path]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """mypy takes a minute of a core: when its test is selected it starts here, at the lowest
    priority, so it runs on what the suite leaves idle (the cluster tests' cuts wait tens of
    seconds) and takes ~1.5 % of a core a test wants; its test reads the result (``mypy_result``)."""
    if not any(item.nodeid == MYPY_TEST for item in session.items):
        return
    with tempfile.NamedTemporaryFile(prefix="rankscope-mypy-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "mypy"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    session.config.stash[_mypy_run] = (proc, Path(log.name))


def pytest_sessionfinish(session: pytest.Session) -> None:
    started = session.config.stash.get(_mypy_run, None)
    if started is not None:
        proc, log = started
        proc.kill()
        proc.wait()
        log.unlink(missing_ok=True)


def mypy_result(config: pytest.Config) -> tuple[int, str]:
    """mypy's exit status and output: the run started with the session, or one now. A run still
    going gets back the normal priority (on a box kept busy it would get ~1.5 % of a core), or,
    where raising a priority is not allowed, gives way to one at the normal priority."""
    started = config.stash.get(_mypy_run, None)
    if started is not None:
        proc, log = started
        try:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # it ended just now
                    os.setpriority(os.PRIO_PROCESS, proc.pid, 0)
            return proc.wait(timeout=600), log.read_text()
        except PermissionError:
            proc.kill()
            proc.wait()
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr
