"""The sink's own threads, supervised: a thread that raises is named by the health check.

Every long-running part (the finalizer, the closer, the write-ahead log's syncer, the transports'
event loops, the view threads) runs on a thread from ``spawn`` (``edge.ports.Spawn``), so that one
that dies says so on ``/healthz`` (503) instead of leaving the sink half alive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .checked import OnError


class Supervisor:
    """The sink's own threads, supervised: one that raises is named by ``health`` (``/healthz`` 503)."""

    def __init__(self, on_error: OnError, stopping: threading.Event) -> None:
        self._on_error = on_error
        self._stopping = stopping
        self.threads: dict[str, threading.Thread] = {}
        self.dead: dict[str, str] = {}

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """``target`` on a daemon thread named ``rankscope-sink-NAME`` (``edge.ports.Spawn``)."""

        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self.dead[name] = f"{type(exc).__name__}: {exc}"
                self._on_error(f"thread {name}", exc)

        thread = threading.Thread(target=run, name=f"rankscope-sink-{name}", daemon=True)
        self.threads[name] = thread
        thread.start()
        return thread

    def join(self, names: tuple[str, ...], timeout: float) -> None:
        """Wait for the named threads to end (the sink is stopping), ``timeout`` each at most."""
        for name in names:
            thread = self.threads.get(name)
            if thread is not None:
                thread.join(timeout)

    def health(self) -> tuple[bool, list[str]]:
        """(healthy, problems): every supervised thread that should run is running."""
        problems = [f"thread {name} died: {why}" for name, why in self.dead.items()]
        if not self._stopping.is_set():
            for name in ("finalizer", "closer", "wal-syncer"):
                thread = self.threads.get(name)
                if thread is not None and not thread.is_alive() and name not in self.dead:
                    problems.append(f"thread {name} is not running")
        return not problems, problems
