"""Processes made by fork: the at-fork hooks, and a forked child's first rankscope call.

A forked child (a torch DataLoader worker, a multiprocessing worker) is a new process with a
copy of this one's memory: the export thread did not survive the fork, and any lock another
thread held at that moment stays held forever in the child. So the child never touches the
parent's runtime (it keeps a reference to it, so that no destructor runs in the child either).
``after_fork_in_child`` forgets it (``ProcessState.forget_parent``: a fresh lock, no fan-outs);
the child's first rankscope call re-arms it (``rearm``): a new export thread and the parent's
identity with a new ``service.instance.id``, ``process.pid`` and ``process.parent_pid``. The
child never flushes, so a sink counts it as one more process of the experiment whose points join
the step in progress, never as a rank it waits for.

The child does not use gRPC: with the gRPC core it inherited, a child crashed now and then
(SIGSEGV, 2 of 160 forks under load; see ``export.senders``). Each fork gets a Unix socket pair
(``before_fork``); the child's export thread sends its OTLP requests over it, and the parent's
``ForkRelay`` thread hands them to the parent's export thread, which exports them with its own
queue and retries. The child exports every ``export_interval`` and at exit: multiprocessing
children end in ``os._exit`` (atexit does not run), so a multiprocessing finalizer shuts
rankscope down first (``shutdown.register_exit_hooks``). Children still running when the parent
shuts down (persistent DataLoader workers) are asked over the same pair to send what they hold,
and the parent waits for them (at most ``CHILD_SHUTDOWN_TIMEOUT``). A parent that keeps its views
to itself (no endpoint, no sink) has nowhere a child's values could go: the child refuses them
with one warning per parent (a shared page remembers that it was said).

The hooks are registered by the first ``init`` of a process (``register_fork_hooks``), never by
importing rankscope. ``os.register_at_fork`` cannot be undone, and a forked child inherits the
registration: so once registered they stay, and do nothing while no runtime is live.
"""

from __future__ import annotations

import mmap
import os
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.resources import Resource

from ..core import names as attr
from ..core import runtime as _slot
from ..core.errors import report_internal_error, warn
from ..core.settings import Settings
from ..export.senders import ForkRelay, RelaySender, fork_pair
from ..metrics.recording import bind_compile_check
from .driving import Runtime, installed
from .state import ForkOrigin, process

CHILD_SHUTDOWN_TIMEOUT = 2.0
"""How long a forked child's shutdown, and a parent's wait for its children's last values, may take."""

StartChild = Callable[[Resource, Settings, RelaySender], Runtime]
"""How a child's runtime is started (the assembler's, given the child's identity and sender)."""


def register_fork_hooks() -> None:
    """Register the at-fork hooks, once per process (under the lifecycle lock)."""
    if not process.fork_hooks:
        process.fork_hooks = True
        os.register_at_fork(
            before=before_fork, after_in_parent=after_fork_in_parent, after_in_child=after_fork_in_child
        )


def before_fork() -> None:
    """In the parent, on the forking thread: a socket pair for the child (or the refusal page)."""
    runtime = installed()
    if runtime is None or _slot.disabled:
        return
    forks = process.forks
    try:
        otlp = runtime.thread.sender
        if otlp is None:
            if forks.refusal_page is None:
                forks.refusal_page = mmap.mmap(-1, 1)
        elif not isinstance(otlp, RelaySender):
            if forks.relay is None:
                forks.relay = ForkRelay(_deliver_relayed)
            forks.pair = fork_pair()
    except Exception as exc:  # the child then refuses its values with a warning
        forks.pair = None
        report_internal_error("fork relay", exc)


def after_fork_in_parent() -> None:
    forks = process.forks
    pair, forks.pair = forks.pair, None
    if pair is not None and forks.relay is not None:
        forks.relay.adopt(pair[0])
        pair[1].close()


def after_fork_in_child() -> None:
    """A forked child is a new process: forget the parent's runtime; the first call re-arms."""
    parent = installed()
    inherited = process.forget_parent()
    _slot.install(None, off=_slot.disabled)
    forks = process.forks
    if parent is not None:
        forks.forked_from = parent
    try:
        if inherited.relay is not None:
            inherited.relay.close_in_child()  # the siblings' sockets are the parent's to read
        if inherited.pair is not None:
            inherited.pair[0].close()
        if parent is not None and not _slot.disabled:
            pair = inherited.pair
            forks.origin = origin_of(parent, None if pair is None else pair[1], forks.refusal_page)
        elif inherited.origin is not None:  # forked again before its first call: same way up
            inherited.origin.parent_pid = os.getppid()
            forks.origin = inherited.origin
    except Exception as exc:  # the child then initializes from its environment
        report_internal_error("fork", exc)


def origin_of(parent: Runtime, sock: Any, warned: mmap.mmap | None) -> ForkOrigin:
    """What a child just forked from ``parent`` keeps of it (runs in the child, right after fork)."""
    parent_pid = os.getppid()
    otlp = parent.thread.sender
    senders: RelaySender | None = None
    listen = False
    why_not = "it keeps its views in its own process (no endpoint, no sink)"
    if isinstance(otlp, RelaySender):  # a grandchild: the same way up to the process that exports
        senders = otlp.for_child()
    elif otlp is not None and sock is not None:
        senders, listen = RelaySender(sock, parent_pid), True
    elif otlp is not None:
        why_not = "no relay socket could be made for this child"
    return ForkOrigin(
        attributes=dict(parent.resource.attributes),
        parent_pid=parent_pid,
        # the parent's, read once at its init; a child's shutdown is shorter
        settings=replace(
            parent.settings, shutdown_timeout=min(parent.settings.shutdown_timeout, CHILD_SHUTDOWN_TIMEOUT)
        ),
        last_step=parent.steps.last,
        senders=senders,
        listen=listen,
        why_not=why_not,
        warned=warned,
    )


def _deliver_relayed(kind: bytes, payload: bytes) -> None:
    """On the parent's relay thread: a child's request, for this process's export thread."""
    runtime = installed()
    if runtime is not None:
        runtime.thread.relay(kind, payload)
    elif not process.forks.late_relayed:  # a child exported after our shutdown: nowhere to send it, but say so
        process.forks.late_relayed = True
        warn("rankscope: a forked child exported values after this process shut rankscope down; not sent")


def rearm(origin: ForkOrigin, start: StartChild) -> None:
    """The child's first call: join the parent's experiment as a process of its own (under the
    lifecycle lock)."""
    process.forks.origin = None
    if origin.senders is None:
        _slot.install(None, off=True)
        page = origin.warned
        if page is None or page[0] == 0:
            if page is not None:
                page[0] = 1
            warn(
                f"rankscope: values recorded in forked child processes (pid {os.getpid()}: DataLoader "
                f"workers, multiprocessing) are not recorded: their parent (pid {origin.parent_pid}) "
                f"{origin.why_not}. To collect them, give the job a sink: RANKSCOPE_SINK=embedded, "
                "RANKSCOPE_ENDPOINT, or `rankscope run`"
            )
        return
    attributes: dict[str, Any] = dict(origin.attributes)
    attributes[attr.SERVICE_INSTANCE_ID] = uuid.uuid4().hex
    attributes[attr.PROCESS_PID] = os.getpid()
    attributes[attr.PROCESS_PARENT_PID] = origin.parent_pid
    senders = origin.senders
    runtime = start(Resource(attributes), origin.settings, senders)
    runtime.steps.auto = False  # never stepped: the sink must not wait for a worker
    runtime.steps.last = origin.last_step  # its spans hang under the parent's step in progress
    if origin.listen:
        senders.listen(lambda: runtime.thread.poll(senders.ack))
    _slot.install(runtime)
    bind_compile_check()
