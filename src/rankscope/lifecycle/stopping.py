"""SIGTERM: a launcher's stop, taken like an exit.

torchrun stops every rank with SIGTERM when one fails (and SIGKILLs what is left 30 s later). Under
Python's default action the process ends at once: the steps it flushed and had not sent yet (up to
a round, 0.2 s of steps) and its goodbye were lost, so the sink counted it missing from steps it
had closed. With ``RANKSCOPE_SIGTERM`` (on by default) and SIGTERM still at its default action at
the first ``init``, rankscope takes it: it runs the exit's ``shutdown`` (within
``RANKSCOPE_SHUTDOWN_TIMEOUT``), then ends the process by SIGTERM's default action, so the launcher
sees the same exit status as before.

Python runs a signal handler only when the main thread is back in the interpreter, and a rank that
waits in a collective is in C++ (gloo, NCCL) until the launcher's SIGKILL. So the handler is also
reached through ``signal.set_wakeup_fd``: Python's C-level handler writes the signal's number to a
pipe whatever the main thread does, and a thread of ours reads it, shuts down and restores the
default action with the C library's ``signal`` (``signal.signal`` is the main thread's only). The
wakeup fd is taken only when nobody holds it (asyncio's loop takes it for its own signal handlers:
then the handler alone starts the stop, once the main thread runs Python again). The handler never
shuts down on the main thread itself: it may run inside rankscope's own code, holding a lock the
shutdown needs, so it starts a thread that does.

Others' handlers come first: SIGTERM handled by the program or a framework before ``init`` is left
alone; a handler installed later that calls ours (Lightning chains the one it found) gets a flush,
not an exit, since the program means to stop on its own terms. A forked child (a DataLoader
worker) gets SIGTERM's default action back and gives up the parent's pipe (it would wake the
parent's thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from types import FrameType

from ..core.errors import report_internal_error
from .shutdown import force_flush, shutdown_at_exit
from .state import process


class _Taken:
    """What this process set up (one per process; a forked child drops it)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self.stopping = threading.Lock()
        """Held by whichever of the reader and the handler's thread stops the process first."""


_taken: _Taken | None = None


def take_sigterm() -> None:
    """At ``init``, on the main thread: take SIGTERM where nobody handles it (the module docstring)."""
    global _taken
    if _taken is not None or os.name != "posix":
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the program's, or a framework's
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        held = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter's main thread
        os.close(read_fd)
        os.close(write_fd)
        return
    if held != -1:  # asyncio's (or the program's): give it back, and rely on the handler alone
        signal.set_wakeup_fd(held)
        os.close(read_fd)
        os.close(write_fd)
        read_fd = write_fd = -1
    _taken = _Taken(read_fd, write_fd)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if read_fd >= 0:
        threading.Thread(target=_watch, args=(_taken,), name="rankscope-sigterm", daemon=True).start()
    if not process.sigterm_fork_hook:
        process.sigterm_fork_hook = True
        os.register_at_fork(after_in_child=_after_fork_in_child)


def _watch(taken: _Taken) -> None:
    """The wakeup pipe's reader: every signal with a Python handler writes its number here."""
    while True:
        try:
            numbers = os.read(taken.read_fd, 64)
        except OSError:
            return
        if not numbers:
            return
        if signal.SIGTERM in numbers and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            _stop(taken)  # the main thread may be in C for as long as the launcher waits


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler, on the main thread between two bytecodes (maybe inside rankscope, holding a
    lock the shutdown needs): the work is a thread's. Ours installed, the process stops; called by
    a handler installed after ours, a flush only (that program stops on its own terms)."""
    taken = _taken
    if taken is None:
        return
    work = (lambda: _stop(taken)) if signal.getsignal(signal.SIGTERM) is _on_sigterm else _flush_only
    threading.Thread(target=work, name="rankscope-sigterm-stop", daemon=True).start()


def _flush_only() -> None:
    try:
        force_flush(2.0)
    except Exception as exc:
        report_internal_error("SIGTERM flush", exc)


def _stop(taken: _Taken) -> None:
    """Shut down as at exit, then end the process by SIGTERM's default action (once)."""
    if not taken.stopping.acquire(blocking=False):
        return  # the other path is stopping it
    try:
        shutdown_at_exit()
    except Exception as exc:
        report_internal_error("SIGTERM shutdown", exc)
    finally:
        _default_and_raise()


def _default_and_raise() -> None:
    """SIGTERM's default action back (from any thread: the C library's ``signal``), and SIGTERM
    again: the process ends as it would have without us (status -15)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signal.SIGTERM, None)  # SIG_DFL is 0
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # delivered to some thread by now
    except Exception as exc:
        report_internal_error("SIGTERM default action", exc)
    os._exit(128 + signal.SIGTERM)  # only if the signal did not end it: the shell's status for it


def _after_fork_in_child() -> None:
    """A forked child: SIGTERM's default action, the parent's pipe given up (our handler and pipe only)."""
    global _taken
    taken, _taken = _taken, None
    if taken is None:
        return
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if taken.write_fd >= 0:
            held = signal.set_wakeup_fd(-1)
            if held != taken.write_fd:  # not ours any more: the holder's stays
                signal.set_wakeup_fd(held)
            os.close(taken.read_fd)
            os.close(taken.write_fd)
    except Exception as exc:
        report_internal_error("SIGTERM after fork", exc)
