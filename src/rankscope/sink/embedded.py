"""The embedded default: one sink per experiment per machine, started by whoever needs it first.

Discovery is a directory per experiment id under ``$RANKSCOPE_RUNTIME_DIR`` (default
``$XDG_RUNTIME_DIR`` or the temp dir, then ``rankscope-$UID/<sha1(experiment)>``):

* ``lock`` — an ``flock`` serializes the processes that look for the sink;
* ``sink.json`` — ``{"pid", "endpoint", "control"}`` of the running sink, written atomically.

The directory is named by a hash, never by the id itself (ids are the client's: ``../x``,
NUL, 10,000 characters), and the id reaches the child sink JSON-encoded, so any id works.

The first process to take the lock finds no live sink, starts ``python -m
rankscope.sink.embedded`` as a child in its own session (so Ctrl-C on the job does not
kill it before the last step is written; its output goes to the job's stdout), waits for
``sink.json`` and releases the lock; the others read ``sink.json``. Different experiments
use different directories, so they never share a sink.

The sink stops by itself once every process that sent it data from this machine, and the
process that started it, have exited: it finalizes the open steps (naming what is
missing), closes its views, removes ``sink.json`` and exits.
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
import time
from pathlib import Path
from typing import Any

_START_TIMEOUT = 60.0


def runtime_dir(experiment: str) -> Path:
    base = os.environ.get("RANKSCOPE_RUNTIME_DIR") or os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    digest = hashlib.sha1(experiment.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return Path(base) / f"rankscope-{os.getuid()}" / digest


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


def _read_live(info: Path, experiment: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(info.read_text())
    except (OSError, ValueError):
        return None
    if found.get("experiment") != experiment or not _alive(int(found.get("pid", 0))):
        return None
    return found


def connect(experiment: str, timeout: float = _START_TIMEOUT) -> tuple[str, str]:
    """The (gRPC endpoint, control URL) of this experiment's sink on this machine, starting it if needed."""
    directory = runtime_dir(experiment)
    directory.mkdir(parents=True, exist_ok=True)
    info = directory / "sink.json"
    with (directory / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = _read_live(info, experiment)
            if found is None:
                found = _start(experiment, info, timeout)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return str(found["endpoint"]), str(found["control"])


def _start(experiment: str, info: Path, timeout: float) -> dict[str, Any]:
    info.unlink(missing_ok=True)
    # JSON (ASCII) in argv: an id may hold NUL or lone surrogates, which argv cannot carry.
    command = [sys.executable, "-m", "rankscope.sink.embedded", "--experiment-json", json.dumps(experiment)]
    command += ["--info", str(info)]
    command += ["--starter-pid", str(os.getpid())]
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _read_live(info, experiment)
        if found is not None:
            return found
        if child.poll() is not None:
            raise RuntimeError(f"the embedded rankscope sink exited with code {child.returncode} while starting")
        time.sleep(0.02)
    child.kill()
    raise TimeoutError(f"the embedded rankscope sink did not start within {timeout:.0f}s")


def serve(experiment: str, info: Path, starter_pid: int, poll: float = 0.2) -> None:
    """Run the sink until every local client and the starter have exited."""
    from ..core.settings import resolve
    from .config import SinkConfig
    from .service import Sink

    config = SinkConfig(grpc_port=0, http_port=0, grace=resolve("sink_grace"), trust_posted_paths=True)
    sink = Sink(config).start()
    payload = {
        "experiment": experiment,
        "pid": os.getpid(),
        "endpoint": sink.endpoint,
        "control": f"http://127.0.0.1:{sink.http_port}",
    }
    tmp = info.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, info)
    host = socket.gethostname()
    try:
        while True:
            time.sleep(poll)
            pids = sink.queries.local_pids(host)
            if not any(_alive(pid) for pid in pids | {starter_pid}):
                break
    finally:
        if _read_live(info, experiment) is not None and json.loads(info.read_text()).get("pid") == os.getpid():
            info.unlink(missing_ok=True)
        sink.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rankscope.sink.embedded")
    parser.add_argument("--experiment-json", required=True, type=json.loads)
    parser.add_argument("--info", required=True, type=Path)
    parser.add_argument("--starter-pid", required=True, type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    serve(str(args.experiment_json), args.info, args.starter_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
