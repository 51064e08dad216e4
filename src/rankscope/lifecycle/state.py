"""What the lifecycle's jobs share within one process, in one object: ``process``.

Not the runtime (the runtime slot, ``core.runtime``, holds that) but what lives beside it: the
lock that ``init``, ``shutdown`` and the first use's auto-init take, whether this process's
at-fork and at-exit hooks are registered, the processes this one drives, what the last shutdown
could not send, the multiprocessing exit hook, and what a fork leaves to do (``ForkState``).

A forked child starts from a copy of its parent's memory: ``ProcessState.forget_parent`` is the
one place that says what of it the child keeps.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.settings import Settings
from ..export.senders import ForkRelay, RelaySender


@dataclass
class ForkOrigin:
    """What a forked child needs from its parent's runtime: plain values, read right after fork
    (``fork.origin_of``), so the child never touches the parent's runtime itself."""

    attributes: dict[str, Any]
    """The parent's Resource attributes (the child's identity is made from them)."""
    parent_pid: int
    settings: Settings
    """The parent's, read once at its init (with a child's shorter shutdown timeout)."""
    last_step: int | None
    """The parent's last closed step: the child's spans hang under the step in progress."""
    senders: RelaySender | None
    """How the child's requests reach the process that exports; None: they are refused."""
    listen: bool
    """Whether the parent may ask this child to flush (it has a socket of its own)."""
    why_not: str
    """Why the child's values are refused (``senders`` is None)."""
    warned: mmap.mmap | None
    """A page shared with the siblings: the refusal is said once per parent."""


@dataclass
class ForkState:
    """What forks leave behind in a process (``fork`` reads and writes it)."""

    origin: ForkOrigin | None = None
    """In a child before its first rankscope call: how that call re-arms it (``fork.rearm``)."""
    refusal_page: mmap.mmap | None = None
    """In a parent with nowhere to send its children's values: the page its children share."""
    relay: ForkRelay | None = None
    """In a parent: the thread that reads its children's requests."""
    pair: tuple[socket.socket, socket.socket] | None = None
    """Between ``before_fork`` and the fork's return: the socket pair made for the child."""
    forked_from: object = None
    """In a child: the parent's runtime, kept referenced and never used (no gRPC destructor runs here)."""
    late_relayed: bool = False
    """A child's request came after this process shut down (said once)."""


@dataclass
class Notices:
    """What this process says on the job's terminal about where its data goes, once each."""

    said_where: str | None = None
    """What ``init`` last said about where this process's metrics go (said again only when it changes)."""
    unsaid_where: str | None = None
    """What auto-init would say about where the metrics go, said at the first ``flush`` instead: an
    ``init`` called after the first recorded value (naming the experiment, the views) replaces it."""
    auto_initializing: bool = False
    """``init`` runs as the first use's auto-init (what it would say waits for the first flush)."""
    sink_starter: int | None = None
    """The pid that started its launch's embedded sink, in that process (a forked child's pid
    differs): it says where the run's report is at shutdown."""
    reported: str | None = None
    """The report page this process had the sink write (``write_report``), or learned at shutdown:
    not said again."""
    report_line: list[str] = field(default_factory=list)
    """Where the report is, learned at shutdown and not printed yet (``shutdown.say_report_line``)."""
    exit_error: str | None = None
    """The exception that ended the program (``sys.excepthook`` saw it): said with the goodbye."""


class ProcessState:
    """The lifecycle's state in this process, beside the runtime slot."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._lock_pid = os.getpid()
        self.fork_hooks = False
        """``os.register_at_fork`` was called (it cannot be undone; a forked child inherits it)."""
        self.exit_hook = False
        """``atexit.register(shutdown)`` was called (a forked child inherits it)."""
        self.sigterm_fork_hook = False
        """SIGTERM's at-fork hook was registered (``stopping``; a forked child inherits it)."""
        self.exited = False
        """The exit-time ``shutdown`` ran: first use no longer starts a runtime."""
        self.exit_thread: int | None = None
        """The thread that ran the exit-time ``shutdown`` first: the main thread at exit, or the SIGTERM
        watcher's stop (``lifecycle.stopping``: the main thread, exiting already, goes on)."""
        self.stopping_timeout: float | None = None
        """The shutdown timeout of the runtime being shut down (``stop_deadline`` once it is uninstalled)."""
        self.exit_finalizer: Any = None
        """In a multiprocessing child: the finalizer that shuts rankscope down before ``os._exit``."""
        self.fan_outs: list[Callable[[int], int]] = []
        """How this process's ``flush(N)`` reaches the processes it drives (``drive_processes``)."""
        self.dropped_before_shutdown = 0
        """``dropped_points()`` after shutdown: what the last runtime lost."""
        self.notices = Notices()
        self.forks = ForkState()

    @property
    def lock(self) -> threading.RLock:
        """Held by ``init``, ``shutdown`` and auto-init. Each process has its own: another thread
        may have held the parent's at fork time, and would never release it in the child."""
        if self._lock_pid != os.getpid():
            self._renew_lock()
        return self._lock

    def _renew_lock(self) -> None:
        self._lock, self._lock_pid = threading.RLock(), os.getpid()

    def forget_parent(self) -> ForkState:
        """In a forked child, right after fork (one thread): drop what was the parent's; returns
        the parent's fork state (what the child must still close or carry on)."""
        inherited = self.forks
        self._renew_lock()
        self.exit_finalizer = None  # multiprocessing clears its finalizers in a child; ours too
        self.fan_outs.clear()  # the processes the parent drives are the parent's
        self.dropped_before_shutdown = 0
        self.exited = False
        self.exit_thread = None
        self.stopping_timeout = None
        self.notices = Notices(said_where=self.notices.said_where)
        self.forks = ForkState(
            refusal_page=inherited.refusal_page,
            forked_from=inherited.forked_from,
            late_relayed=inherited.late_relayed,
        )
        return inherited


process = ProcessState()
"""The one instance (a forked child has its copy, which ``forget_parent`` clears)."""
