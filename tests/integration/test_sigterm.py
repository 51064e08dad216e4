"""SIGTERM, as torchrun sends it to every rank when one fails: a rank waiting in C++ sends the steps
it flushed and its goodbye, then ends by SIGTERM (``lifecycle.stopping``); a program's own handler
is left alone, and one that calls ours gets a flush without an exit; a forked child ends at once."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from rankscope.sink import Sink

from ..conftest import ROOT, run_python
from ..pipeline import clean_env

WORKER = ROOT / "tests" / "workers" / "sigterm_worker.py"


def sigterm_once(command: list[str], ready: str, **env: str) -> tuple[int, float, str, str]:
    """``command`` SIGTERMed once a line of its stdout starts with ``ready``: its exit status,
    seconds from SIGTERM to exit, its stdout and its stderr."""
    worker = subprocess.Popen(
        command, env=clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert worker.stdout is not None
        for line in worker.stdout:
            if line.startswith(ready):
                break
        else:
            raise AssertionError(f"never said {ready!r}: {worker.communicate(timeout=30)[1][-3000:]}")
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
        return worker.returncode, time.monotonic() - sent, out, err
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)


def stopped(sink: Sink, first: str, **env: str) -> tuple[int, float, str]:
    """The worker SIGTERMed once it waits: its exit status, seconds from SIGTERM to exit, its output."""
    status, took, out, err = sigterm_once([sys.executable, str(WORKER), sink.endpoint, first], "blocked", **env)
    return status, took, out + err


def finalized(sink: Sink, step: int) -> dict[str, Any]:
    """The experiment's status once it finalized ``step``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = sink.status("sigterm")
        if status is not None and (status["last_finalized_step"] or -1) >= step:
            return status
        time.sleep(0.05)
    raise AssertionError(f"step {step} was not finalized: {sink.status('sigterm')}")


@pytest.mark.timeout(120)
def test_a_rank_stopped_in_cxx_sends_its_flushed_steps_and_goodbye_then_ends_by_sigterm(make_sink: Any) -> None:
    """Under Python's default action the rank ended at once, without its goodbye (the run never
    ended), and the steps it had flushed within the last round (0.4 s) were lost; a handler of
    Python's own waits for the store's timeout (40 s) before it runs."""
    sink = make_sink()
    status, took, said = stopped(sink, "none")
    assert status == -signal.SIGTERM, said[-3000:]  # what the launcher saw before
    assert took < 10, took  # not the launcher's SIGKILL 30 s later: the C++ wait did not hold it
    state = finalized(sink, 4)
    assert state["points"] == 5 and state["runs"][0]["ended"] is True, state


@pytest.mark.timeout(120)
def test_with_no_wakeup_fd_left_by_asyncio_the_handler_wakes_the_watcher(make_sink: Any) -> None:
    """An asyncio loop with signal handlers of its own, closed, leaves no wakeup fd: the stop comes
    from our handler, once the main thread runs Python, the same way."""
    sink = make_sink()
    status, took, said = stopped(sink, "asyncio")
    assert status == -signal.SIGTERM and took < 10, (took, said[-3000:])
    state = finalized(sink, 4)
    assert state["points"] == 5 and state["runs"][0]["ended"] is True, state


NATIVE = """
import ctypes, signal
import rankscope as rs
ctypes.CDLL(None).signal(signal.SIGTERM, ctypes.c_void_p(1))  # SIG_IGN, as a native runtime would set it
rs.init(experiment="sigterm-native", role="trainer")
print("left alone", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
"""


def test_a_disposition_set_in_c_is_left_alone() -> None:
    """``signal.getsignal`` does not see what C, C++ or Rust code set after Python started."""
    done = run_python(NATIVE, env={"RANKSCOPE_CONSOLE": "off"}, timeout=60)
    assert done.returncode == 0 and "left alone True" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.timeout(120)
def test_the_programs_own_handler_is_left_alone_and_one_that_calls_ours_gets_a_flush(make_sink: Any) -> None:
    """A handler installed before ``init`` is the program's: rankscope does not take SIGTERM. One
    installed after it that calls the one it found (Lightning's way) stops the program on its own
    terms: ours flushes, the process lives on, and its exit says goodbye as usual."""
    for first in ("handler", "chained"):
        sink = make_sink()
        status, _, said = stopped(sink, first)
        assert status == 0 and "handled [15]" in said, (first, said[-3000:])
        state = finalized(sink, 4)
        assert state["points"] == 5 and state["runs"][0]["ended"] is True, (first, state)


FORKED = """
import os, signal, sys, time
import rankscope as rs
rs.init(experiment="sigterm-fork", role="trainer")  # no endpoint: local views
pid = os.fork()
if pid == 0:
    time.sleep(30)  # a worker; the parent stops it
    os._exit(0)
time.sleep(0.2)
t = time.monotonic()
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
took = time.monotonic() - t
time.sleep(0.5)  # the parent's reader would have stopped it by now
rs.record_metric("loss", 1.0)
rs.flush(0)
print("child", os.waitstatus_to_exitcode(status), "in", round(took, 1), "parent on", rs.get_resource() is not None)
"""


def test_a_forked_child_ends_at_once_and_its_sigterm_does_not_reach_the_parent() -> None:
    """A DataLoader worker shares the parent's wakeup pipe unless it gives it up: its SIGTERM would
    wake the parent's reader and stop the parent."""
    done = run_python(FORKED, env={"RANKSCOPE_CONSOLE": "off"}, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    child, took, parent = done.stdout.split()[1], float(done.stdout.split()[3]), done.stdout.split()[-1]
    assert (child, parent) == ("-15", "True") and took < 5, done.stdout


BACK_FROM_C = """
import hashlib, sys
import rankscope as rs

rs.init(experiment="sigterm", endpoint=sys.argv[1])
data = bytes(16 << 20)
for step in range(400):
    print(f"step {step} started", flush=True)
    hashlib.sha256(data).digest()  # C without the GIL, deaf to signals: the watcher's stop begins meanwhile
    rs.record_metric("loss", 1.0)
    rs.flush(step)
"""


@pytest.mark.timeout(120)
def test_a_rank_back_from_c_after_sigterm_runs_no_further_step() -> None:
    """SIGTERM while the main thread computes in C with the GIL released (a backward pass): the
    watcher's stop starts at once, and the main thread, back in Python, waits in the handler until
    the process ends by SIGTERM. It is not exiting itself: it must not go on to another step while
    the stop drains (3 s here, to an endpoint that takes connections and never answers)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody answers
        command = [sys.executable, "-c", BACK_FROM_C, f"127.0.0.1:{silent.getsockname()[1]}"]
        status, _, out, err = sigterm_once(command, "step 3 started", RANKSCOPE_SHUTDOWN_TIMEOUT="3")
    assert status == -signal.SIGTERM, err[-3000:]
    assert "step 5 started" not in out, out[-500:] + err[-3000:]  # step 4 may have begun as the signal came
    assert "called after its exit-time shutdown" not in err, err[-3000:]  # nothing recorded once the stop began
