"""The embedded default: one sink per launch of an experiment per machine, started by whoever
needs it first; and how a command on this machine finds a running sink (``discover``).

Discovery files live under ``$RANKSCOPE_RUNTIME_DIR`` (default ``$XDG_RUNTIME_DIR`` or the temp
dir), in ``rankscope-$UID/``:

* ``<sha1(experiment, run)>/lock`` — an ``flock`` serializes the processes that look for the sink;
* ``<sha1(experiment, run)>/sink.json`` — ``{"experiment", "run", "pid", "endpoint", "control",
  "started"}`` of the running embedded sink, written atomically;
* ``run-<pid>.json`` — a ``rankscope run`` sink's ``{"pid", "endpoint", "control", "started",
  "command"}``, written atomically when it starts and removed when it stops (``announce``).

Names are hashes and pids, never the ids themselves (ids are the client's: ``../x``, NUL, 10,000
characters), and an id reaches the child sink JSON-encoded, so any id works. A file whose pid is
dead is ignored, and so is a ``rankscope-$UID`` directory another user owns.

The first process of a launch to take the lock finds no live sink, starts ``python -m
rankscope.sink.embedded`` as a child in its own session (so Ctrl-C on the job does not kill it
before the last step is written; its output goes to the job's stdout), waits until the sink is
ready (it writes ``sink.json`` once its receivers listen) and releases the lock; the others read
``sink.json``. Each launch (a run: ``rankscope.run.id``) has its own directory, so two launches of
one script never share a sink, nor its output.

The sink stops by itself once every process that sent it data from this machine, and the
process that started it, have exited: it finalizes the open steps (naming what is missing),
closes its views, removes ``sink.json`` and exits.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_START_TIMEOUT = 60.0


def base_dir() -> Path:
    """``rankscope-$UID`` under the runtime directory: where this user's sinks announce themselves."""
    base = os.environ.get("RANKSCOPE_RUNTIME_DIR") or os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"rankscope-{os.getuid()}"


def runtime_dir(experiment: str, run: str = "") -> Path:
    """The directory of one launch's embedded sink (named by a hash of the experiment and the run)."""
    key = experiment if not run else f"{experiment}\0{run}"
    digest = hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return base_dir() / digest


def _alive(pid: int) -> bool:
    """Running (a zombie has exited: its parent may be busy reading our output before reaping it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust the signal check
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _read(info: Path) -> dict[str, Any] | None:
    """A discovery file's contents when its pid is alive."""
    try:
        found = json.loads(info.read_text())
        pid = int(found.get("pid", 0)) if isinstance(found, dict) else 0
    except (OSError, ValueError, TypeError):
        return None
    return found if pid > 0 and _alive(pid) else None


def _read_live(info: Path, experiment: str, run: str = "") -> dict[str, Any] | None:
    found = _read(info)
    if found is None or found.get("experiment") != experiment or str(found.get("run") or "") != run:
        return None
    return found


def connect(
    experiment: str, run: str = "", timeout: float = _START_TIMEOUT, on_start: Callable[[], object] | None = None
) -> tuple[str, str]:
    """The (gRPC endpoint, control URL) of this launch's sink on this machine, started (and waited
    for until it takes exports) if needed; ``on_start`` is called when this process started it."""
    directory = runtime_dir(experiment, run)
    directory.mkdir(parents=True, exist_ok=True)
    info = directory / "sink.json"
    with (directory / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = _read_live(info, experiment, run)
            if found is None:
                found = _start(experiment, run, info, timeout)
                if on_start is not None:
                    on_start()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return str(found["endpoint"]), str(found["control"])


_SPAWNING = threading.Lock()
"""Held while ``Popen`` starts the sink, and by an ``os.fork`` of another thread (a DataLoader
worker's) meanwhile: a child forked between ``Popen``'s pipes and their closing holds its error
pipe open, and ``Popen`` then waits for that child to exit (with the lock every other rank waits on)."""
_fork_guarded = False


def _guard_forks() -> None:
    global _fork_guarded
    if not _fork_guarded:
        _fork_guarded = True
        os.register_at_fork(
            before=_SPAWNING.acquire, after_in_parent=_SPAWNING.release, after_in_child=_SPAWNING.release
        )


def _start(experiment: str, run: str, info: Path, timeout: float) -> dict[str, Any]:
    info.unlink(missing_ok=True)
    # JSON (ASCII) in argv: an id may hold NUL or lone surrogates, which argv cannot carry.
    command = [sys.executable, "-m", "rankscope.sink.embedded", "--experiment-json", json.dumps(experiment)]
    command += ["--run-json", json.dumps(run), "--info", str(info), "--starter-pid", str(os.getpid())]
    _guard_forks()
    with _SPAWNING:  # Popen forks in C, without the at-fork hooks: no wait on itself
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _read_live(info, experiment, run)
        if found is not None:
            return found
        if child.poll() is not None:
            raise RuntimeError(f"the embedded rankscope sink exited with code {child.returncode} while starting")
        time.sleep(0.02)
    child.kill()
    raise TimeoutError(f"the embedded rankscope sink did not start within {timeout:.0f}s")


def serve(experiment: str, info: Path, starter_pid: int, poll: float = 0.2, run: str = "") -> None:
    """Run the sink until every local client and the starter have exited."""
    from ..core.settings import resolve
    from .book.config import BookConfig
    from .config import JOB_START_HOLD, KEPT_BACKENDS, RunLimits, SinkConfig
    from .service import Sink

    config = SinkConfig(
        grpc_port=0,
        http_port=0,
        book=BookConfig(grace=resolve("sink_grace"), start_hold=JOB_START_HOLD),
        trust_posted_paths=True,
        runs=RunLimits(close_ended=False),  # one job's sink: its runs stay until it exits
        added_views=KEPT_BACKENDS if resolve("keep") else {},  # every run on disk, as W&B and TensorBoard keep theirs
    )
    sink = Sink(config).start()  # its receivers listen: what sink.json announces takes exports
    payload = {
        "experiment": experiment,
        "run": run,
        "pid": os.getpid(),
        "endpoint": sink.endpoint,
        "control": f"http://127.0.0.1:{sink.http_port}",
        "started": time.time(),
    }
    _write_atomically(info, payload)
    host = socket.gethostname()
    try:
        while True:
            time.sleep(poll)
            pids = sink.queries.local_pids(host)
            if not any(_alive(pid) for pid in pids | {starter_pid}):
                break
    finally:
        found = _read_live(info, experiment, run)
        if found is not None and found.get("pid") == os.getpid():
            info.unlink(missing_ok=True)
        sink.stop()


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def announce(endpoint: str, control: str, command: list[str]) -> Path:
    """Say that this process (``rankscope run``) serves a sink: ``run-<pid>.json``, written
    atomically; ``withdraw`` removes it when the sink stops."""
    directory = base_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"run-{os.getpid()}.json"
    payload = {"pid": os.getpid(), "endpoint": endpoint, "control": control, "started": time.time()}
    _write_atomically(path, {**payload, "command": command[:64]})
    return path


def withdraw(path: Path) -> None:
    path.unlink(missing_ok=True)


def discover() -> list[dict[str, Any]]:
    """The sinks running on this machine for this user, newest first: ``rankscope run``'s and the
    embedded ones, each ``{"pid", "endpoint", "control", "started", ...}``; dead pids left out."""
    directory = base_dir()
    try:
        if directory.stat().st_uid != os.getuid():
            return []  # not ours: another user could point our commands (and tokens) anywhere
    except OSError:
        return []
    found = []
    for info in [*directory.glob("run-*.json"), *directory.glob("*/sink.json")]:
        live = _read(info)
        if live is not None and isinstance(live.get("control"), str):
            found.append(live)
    found.sort(key=lambda f: float(f.get("started") or 0.0), reverse=True)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rankscope.sink.embedded")
    parser.add_argument("--experiment-json", required=True, type=json.loads)
    parser.add_argument("--run-json", default='""', type=json.loads)
    parser.add_argument("--info", required=True, type=Path)
    parser.add_argument("--starter-pid", required=True, type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    serve(str(args.experiment_json), args.info, args.starter_pid, run=str(args.run_json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
