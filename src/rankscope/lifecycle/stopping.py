"""SIGTERM: a launcher's stop, taken like an exit.

torchrun stops every rank with SIGTERM when one fails (and SIGKILLs what is left 30 s later). Under
Python's default action the process ends at once: the steps it flushed and had not sent yet (up to
a round, 0.6 s of steps) and its goodbye were lost, so the sink counted it missing from steps it
had closed. With ``RANKSCOPE_SIGTERM`` (on by default), where SIGTERM still has its default action
at the first ``init``, rankscope takes it: it runs the exit's ``shutdown``, cut off at
``RANKSCOPE_SHUTDOWN_TIMEOUT`` plus a second (``stop_deadline``; a sink this job owns is not waited
for longer), then ends the process by SIGTERM's default action: the launcher sees the same status.

Python runs a signal handler only when the main thread is back in the interpreter, and a rank that
waits in a collective is in C++ (gloo, NCCL) until the launcher's SIGKILL. So a thread of ours (the
*watcher*, started at ``init``) reads a pipe that is also Python's ``signal.set_wakeup_fd``: Python's
C-level handler writes the signal's number there whatever the main thread does. The watcher shuts
down and restores the default action with the C library's ``signal`` (``signal.signal`` is the main
thread's only). The wakeup fd is taken only when nobody holds it; the Python-level handler also
writes to the pipe, so the stop comes whoever holds the wakeup fd later (asyncio's loop, for its own
handlers), once the main thread runs Python. The handler starts nothing itself (a thread's start
takes locks the interrupted code may hold): it wakes the watcher and waits, so the training loop
runs no further meanwhile; a process already exiting (torchrun stops a rank that raised too, while
its exit's shutdown runs) goes on with its exit, which the watcher bounds.

Others' handlers come first: SIGTERM handled before ``init``, by Python code or by a C/C++/Rust
runtime (the C library's disposition is read too), is left alone, and so is PID 1 (a container's
init, where the kernel drops a default-action SIGTERM). A handler installed later that calls ours
(Lightning chains the one it found) gets a flush, not an exit: that program stops on its own terms.
A forked child (a DataLoader worker) gets SIGTERM's default action back and gives up the parent's
pipe (it would wake the parent's watcher).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from types import FrameType

from ..core.errors import report_internal_error
from .driving import installed
from .shutdown import force_flush, say_report_line, shutdown_at_exit
from .state import process

FLUSH = b"\xff"
"""Written to the pipe by our handler when another handler called it: a flush, not a stop."""


class _Taken:
    """What this process set up (one per process; a forked child drops it)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd


_taken: _Taken | None = None


def take_sigterm() -> None:
    """At ``init``, on the main thread: take SIGTERM where nobody handles it (the module docstring)."""
    global _taken
    if _taken is not None or os.name != "posix" or os.getpid() == 1:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL or not _default_in_c():
        return  # the program's, or a framework's, or a native runtime's
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        held = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter's main thread
        os.close(read_fd)
        os.close(write_fd)
        return
    if held != -1:  # asyncio's (or the program's): give it back; our handler writes to our pipe
        signal.set_wakeup_fd(held)
    _taken = _Taken(read_fd, write_fd)
    signal.signal(signal.SIGTERM, _on_sigterm)
    threading.Thread(target=_watch, args=(_taken,), name="rankscope-sigterm", daemon=True).start()
    if not process.sigterm_fork_hook:
        process.sigterm_fork_hook = True
        os.register_at_fork(after_in_child=_after_fork_in_child)


def _default_in_c() -> bool:
    """Whether the C library's disposition of SIGTERM is the default: a handler a native runtime
    installed after Python started is not visible to ``signal.getsignal``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        action = ctypes.create_string_buffer(512)  # a struct sigaction, its handler first
        if libc.sigaction(signal.SIGTERM, None, action) != 0:
            return False
        return not ctypes.c_void_p.from_buffer(action).value  # SIG_DFL is 0
    except Exception:
        return False


def stop_deadline() -> float:
    """Seconds the stop's shutdown may take before the process ends anyway: the shutdown timeout
    and a second, at most 20 (torchrun's SIGKILL comes 30 s after its SIGTERM)."""
    runtime = installed()
    timeout = runtime.shutdown_timeout if runtime is not None else process.stopping_timeout or 2.0
    return min(timeout + 1.0, 20.0)


def _watch(taken: _Taken) -> None:
    """The pipe's reader: the signal numbers Python's C handler writes, and our handler's bytes."""
    while True:
        try:
            numbers = os.read(taken.read_fd, 64)
        except OSError:
            return
        if not numbers:
            return
        if FLUSH in numbers:
            _flush_only()
        if signal.SIGTERM in numbers and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            _stop()  # the main thread may be in C for as long as the launcher waits
            return


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler, on the main thread between two bytecodes (maybe inside rankscope, holding
    a lock the shutdown needs): it only wakes the watcher. Ours installed, the process stops, and the
    main thread waits for it, unless it is running the exit's shutdown itself (``exit_thread``; not
    the watcher's stop, which a main thread back from C must not outrun): parked there, it would
    hold the lifecycle lock, and what that shutdown had still to send or say (the report's line,
    torchrun's SIGTERM to a sink's starter that raised) was lost. Called by a handler installed
    after ours, a flush only."""
    taken = _taken
    if taken is None:
        return
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        _poke(taken, FLUSH)
        return
    _poke(taken, bytes([signal.SIGTERM]))  # whoever holds the wakeup fd now
    if process.exit_thread == threading.get_ident():
        return  # the exit's shutdown, under way on this thread, goes on: the watcher bounds it
    time.sleep(stop_deadline() + 2.0)  # the watcher ends the process meanwhile; nothing more runs here


def _poke(taken: _Taken, what: bytes) -> None:
    with contextlib.suppress(OSError):  # the pipe full: the watcher has bytes to read already
        os.write(taken.write_fd, what)


def _flush_only() -> None:
    try:
        force_flush(2.0)
    except Exception as exc:
        report_internal_error("SIGTERM flush", exc)


def _stop() -> None:
    """Shut down as at exit, on a thread of its own cut off at ``stop_deadline``, then end the
    process by SIGTERM's default action."""
    deadline = stop_deadline()  # before the shutdown uninstalls the runtime
    worker = threading.Thread(target=_shut_down, name="rankscope-sigterm-shutdown", daemon=True)
    worker.start()
    worker.join(deadline)
    # A shutdown under way when SIGTERM came waits in the handler: where the report is, said now, on a
    # thread of its own (the parked main thread may hold stdout's lock), a second at most.
    speaker = threading.Thread(target=_say_report_line, name="rankscope-sigterm-report", daemon=True)
    speaker.start()
    speaker.join(1.0)
    _default_and_raise()


def _say_report_line() -> None:
    try:
        say_report_line()
    except Exception as exc:
        report_internal_error("SIGTERM report line", exc)


def _shut_down() -> None:
    try:
        shutdown_at_exit()
    except Exception as exc:
        report_internal_error("SIGTERM shutdown", exc)


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
        held = signal.set_wakeup_fd(-1)
        if held != taken.write_fd:  # not ours: the holder's stays
            signal.set_wakeup_fd(held)
        os.close(taken.read_fd)
        os.close(taken.write_fd)
    except Exception as exc:
        report_internal_error("SIGTERM after fork", exc)
