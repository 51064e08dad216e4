"""SIGTERM (torchrun ending the other ranks once one failed, Slurm's preemption, Kubernetes' stop):
what the process flushed goes out, with its goodbye, before it dies of the signal as it would have.

Without it the signal's default action ended the process at once: the steps it had flushed but not
yet exported were lost (up to an export round, 0.2 s), and its sink named it as not having closed a
step it had closed. ``install`` (by the first ``init``, in the main thread) takes SIGTERM only while
it has its default action: a handler the program or a framework set is left alone, and one set later
replaces this one. On the signal the exit's shutdown runs on a thread of its own, waited for at most
``TERM_WAIT_S`` (the signal may have come while the main thread held a lock that shutdown takes:
then the wait is what is lost), and the signal is raised again with its default action, so the
process ends with -SIGTERM, as its launcher expects. A forked child (a DataLoader worker) inherits
the handler and dies at once, as before.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from ..core.errors import report_internal_error

TERM_WAIT_S = 5.0
"""How long a terminated process sends what it flushed before it dies (launchers wait 30 s)."""

_installed_in: int | None = None
"""The pid that installed the handler: in a forked child it only dies."""


def install(on_term: Callable[[], None]) -> bool:
    """Run ``on_term`` (bounded) before a SIGTERM ends this process; False when SIGTERM is not at
    its default action or this is not the main thread (signals are the main thread's)."""
    global _installed_in
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False

        def send_what_was_flushed() -> None:
            try:
                on_term()
            except Exception as exc:  # never more than the signal itself would have cost
                report_internal_error("shutdown on SIGTERM", exc)

        def handler(signum: int, frame: FrameType | None) -> None:
            if os.getpid() == _installed_in:
                worker = threading.Thread(target=send_what_was_flushed, name="rankscope-sigterm", daemon=True)
                worker.start()
                worker.join(TERM_WAIT_S)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # no signals here (an embedded interpreter)
        return False
    _installed_in = os.getpid()
    return True
