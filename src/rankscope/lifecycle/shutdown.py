"""Taking a process's runtime down: ``shutdown``, ``force_flush``, the report, and the exit hooks.

``shutdown`` closes the last automatic step, asks forked children still running for what they
hold, stops a running profiler, sends what is left (unflushed values without a step) and stops
the export thread within ``RANKSCOPE_SHUTDOWN_TIMEOUT``; with a sink this job owns it returns
once the sink has written this process's last step. It runs at exit too: ``register_exit_hooks``
(called by ``init``, never at import) registers it with ``atexit`` and, in a multiprocessing
child (which leaves through ``os._exit``), as a multiprocessing finalizer.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any

from ..backends.console import printable, write_line
from ..core import names as attr
from ..core import runtime as _slot
from ..core.errors import report_internal_error, warn
from ..core.paths import shown_path
from ..export.senders import request_report, sink_status
from ..metrics import rates
from ..metrics.catalog import key_kind
from .driving import Runtime, installed, say_where_at_first_flush, started
from .fork import CHILD_SHUTDOWN_TIMEOUT
from .state import process

UNANSWERED_STATUS_LIMIT = 3
"""Status requests in a row without an answer (2 s each at most) before a job stops waiting for its
sink's views: a sink gone refuses at once, a sink busy with the job's last sends answers late."""
SAY_REPORT_WAIT_S = 30.0
"""How long the process that started the sink waits for it to say where the report is: a sink
alive but busy with the job's last sends answers late, and the line is what the user looks for."""
SAY_AFTER_END_WAIT_S = 5.0
"""How long, of that, it waits for a failed run to be over (every process said goodbye, every step
written) before it says where the report is anyway: the line comes after the failed step's (final
at the last goodbye), unless another process goes on past that. A run nobody failed in: no wait."""


def shutdown() -> None:
    """Export what is left (unflushed values go out without a step, ``_tail_step``) and stop the
    export thread. Until the next ``init``, instrumentors record nothing (``core.runtime.ended``)."""
    with process.lock:
        shutdown_locked()
        _slot.ended = True


def shutdown_locked(drain_unflushed: bool = True) -> None:
    """``shutdown`` under the lifecycle lock; ``init`` calls it with ``drain_unflushed=False`` to
    replace a runtime (the recorder and step clock live on in the new one)."""
    runtime = installed()
    if runtime is not None:
        process.stopping_timeout = runtime.shutdown_timeout
    if runtime is not None and drain_unflushed:
        say_where_at_first_flush()  # a process that never flushed hears it now
        try:
            _close_last_auto_step(runtime)
        except Exception as exc:
            report_internal_error("last automatic step", exc)
        relay = process.forks.relay
        if relay is not None:
            # Forked children still running (persistent DataLoader workers) send what they hold first.
            late = relay.flush_children(min(runtime.shutdown_timeout, CHILD_SHUTDOWN_TIMEOUT))
            if late:
                warn(f"rankscope: {late} forked child process(es) did not send their values before shutdown")
    _slot.install(None, off=_slot.disabled)
    if runtime is None:
        return
    if runtime.thread.captures is not None:
        runtime.thread.captures.abort()  # a profiler still running stops here, its capture dropped
    runtime.tracing.shutdown()  # GPU-timed spans still pending go to the buffer first
    if drain_unflushed:
        batch = runtime.recorder.take(_tail_step(runtime))
        if batch is not None:
            runtime.thread.submit(batch)
    exit_error = process.notices.exit_error if process.exited else None
    runtime.thread.shutdown(runtime.shutdown_timeout, exit_error, runtime.steps.current if exit_error else None)
    if runtime.thread.captures is not None:
        runtime.thread.captures.finish(runtime.shutdown_timeout)  # the traces finished, sent
    if drain_unflushed:
        rates.reset_rates()
    process.dropped_before_shutdown = runtime.thread.dropped_total
    _wait_for_sink_views(runtime)
    if drain_unflushed:
        _say_report(runtime)


def _note_exit_error(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """``sys.excepthook``, chained: Python calls it with the exception that ends the program, just
    before the exit handlers, so the goodbye says which process failed and why instead of the sink
    saying only that the job ended. Ctrl-C is an interruption, not an error; an interactive
    session's errors (IPython's own handler, a REPL's) never come here."""
    if isinstance(value, Exception):
        process.notices.exit_error = describe_error(value)
    _previous_hook(kind, value, tb)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` on one line (the type alone when the message is empty or cannot be made)."""
    try:
        message = " ".join(str(exc).split())
    except Exception:
        message = ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


_previous_hook = sys.excepthook


def _tail_step(runtime: Runtime) -> int | None:
    """The step the values recorded since the last flush go with: none (the sink places them in
    the step in progress, which the job ended in), unless they are all rankscope's own (a final
    ``dist.barrier()``'s time): then the last step flushed, as its tail, not a step of their own."""
    last, recorder = runtime.steps.last, runtime.recorder
    if last is None or recorder.samples or recorder.phases or recorder.device.items:
        return None
    keys = list(recorder.recorded())
    return last if keys and all(key_kind(key) == "internal" for key in keys) else None


def _close_last_auto_step(runtime: Runtime) -> None:
    """In a job whose steps the instrumentors close, what was recorded after the last
    optimizer step (the last loss averaging, a final checkpoint) becomes one more step."""
    runtime.settle_auto_step()
    steps = runtime.steps
    if steps.auto and steps.last is not None and runtime.recorder.recorded():
        runtime.close(steps.last + 1, driven=False, auto=True)


def _wait_for_sink_views(runtime: Runtime) -> None:
    """With a sink that this job owns, return once it has written this process's last step,
    so the job's final views are out when the program ends (bounded by the shutdown timeout)."""
    senders = runtime.thread.sender
    control = getattr(senders, "control_url", None)
    last = runtime.steps.last
    if control is None or last is None:
        return
    experiment = str(runtime.resource.attributes[attr.EXPERIMENT_ID])
    deadline = time.monotonic() + runtime.shutdown_timeout
    unanswered = 0
    while time.monotonic() < deadline and unanswered < UNANSWERED_STATUS_LIMIT:
        status = sink_status(control, experiment, run=str(runtime.resource.attributes.get(attr.RUN_ID) or "") or None)
        if status is not None and status.get("last_written_step", -1) >= last:
            return
        unanswered = unanswered + 1 if status is None else 0  # a busy sink answers late: asked again
        time.sleep(0.05)


def _say_report(runtime: Runtime) -> None:
    """The process that started its launch's embedded sink says, once the sink wrote its last step,
    where the run is kept (``RANKSCOPE_KEEP``): the report view's page, which the sink writes at its
    end (with the steps of processes still running then). Said on stdout, where the steps' lines
    went; a status request, asked again while a sink busy with the job's last sends does not answer
    (up to ``SAY_REPORT_WAIT_S``), never a page rendered while the job waits to exit. Nothing when
    the run has no report view, nor when this process already asked for it (``write_report``).

    When the sink says a process failed, said after the failed step where it can be: once the run
    is over, up to ``SAY_AFTER_END_WAIT_S``; at once by a process an exception ended (the others may
    wait for it in a collective: their sockets close, and torchrun stops them, only once it has
    exited). A launcher's SIGTERM meanwhile leaves an exit's shutdown to go on (``lifecycle.stopping``,
    bounded by ``stop_deadline``) and holds the main thread in its handler otherwise: the stop says
    the line then (``say_report_line``)."""
    notices = process.notices
    control = getattr(runtime.thread.sender, "control_url", None)
    if notices.sink_starter != os.getpid() or control is None or notices.reported is not None:
        return
    a = runtime.resource.attributes
    experiment = str(a[attr.EXPERIMENT_ID])
    run = str(a.get(attr.RUN_ID) or "") or None
    begun = time.monotonic()
    deadline = begun + SAY_REPORT_WAIT_S
    patience = 0.0 if notices.exit_error is not None else SAY_AFTER_END_WAIT_S
    try:
        page: object = _UNSAID
        while time.monotonic() < deadline:  # its pool busy with the job's last sends
            status = sink_status(control, experiment, timeout=max(0.5, deadline - time.monotonic()), run=run)
            page = _UNSAID if status is None else _page_of(status, runtime.steps.last)
            if isinstance(page, str) and notices.reported is None:
                shown = shown_path(page)
                notices.reported = str(shown)
                compare = shown.parent.parent if attr.RUN_ID in a else shown.parent
                every = f"every run of {printable(experiment)}: rankscope report {compare}/"
                notices.report_line.append(f"report: {shown}  ({every})")
            if page is None or (page is not _UNSAID and not _waits_for_end(status, begun, patience)):
                break
            time.sleep(0.2 if page is _UNSAID else 0.05)
        if page is _UNSAID:
            warn(
                f"rankscope: the sink did not say where the report is in {SAY_REPORT_WAIT_S:.0f} s; the run's "
                "directory under rankscope_logs/ holds it (`rankscope report DIR` writes it again)"
            )
            return
    except Exception as exc:  # a sink answering oddly: nothing more to learn, never raised into the exit
        report_internal_error("saying where the report is", exc)
    say_report_line()


def _waits_for_end(status: dict[str, Any] | None, begun: float, patience: float) -> bool:
    """Whether to ask again before saying where the report is: a process failed (the status says
    so), the run is not over yet, and ``patience`` has not run out."""
    failed = status.get("failed") if status is not None else None
    return bool(failed) and time.monotonic() - begun < patience and not _run_over(status)


def say_report_line() -> None:
    """Print where the report is, once, if ``_say_report`` learned it (any thread: SIGTERM's stop
    too, while the main thread may wait in the handler anywhere: no lock, ``list.pop`` is atomic)."""
    try:
        line = process.notices.report_line.pop()
    except IndexError:
        return
    with contextlib.suppress(OSError, ValueError):  # stdout closed or a pipe gone (``| head``): nobody to tell
        write_line(sys.stdout, line)


_UNSAID = object()
"""``_page_of``'s answer while the sink has not written the report view yet."""


def _page_of(status: dict[str, Any], last: int | None) -> object:
    """Where the status says the report page is; ``_UNSAID`` while the sink has not written this
    process's last step (a view's location comes with its first write: a sink still busy with the
    job's steps, which shutdown's wait gave up on); None when it has and no view writes a page."""
    views = (status.get("views") or {}).values()
    page = next((v.get("location") for v in views if _is_page(v)), None)
    if page is None and last is not None and status.get("last_written_step", -1) < last:
        return _UNSAID
    return page


def _run_over(status: dict[str, Any] | None) -> bool:
    """The status's run is over and its views wrote every step: every process of it said goodbye
    (its entry in ``runs``), no step is open, the last finalized one is written."""
    if status is None:
        return False
    written, final = status.get("last_written_step"), status.get("last_finalized_step")
    if status.get("open_steps") != 0 or not isinstance(written, int) or not isinstance(final, int) or written < final:
        return False
    runs = status.get("runs")
    return isinstance(runs, list) and any(
        isinstance(r, dict) and r.get("run") == status.get("run") and r.get("ended") is True for r in runs
    )


def _is_page(view: object) -> bool:
    """A view of the status route that writes a report page (its location an ``.html`` file)."""
    return isinstance(view, dict) and not view.get("disabled") and str(view.get("location") or "").endswith(".html")


def shutdown_at_exit() -> None:
    """``shutdown`` as the process exits. It is registered by the first ``init``, so an exit
    handler the program registered before that runs after it: a rankscope call from such a handler
    is not recorded (auto-init warns once) rather than starting a runtime nothing would shut down."""
    process.exited = True
    if process.exit_thread is None:
        process.exit_thread = threading.get_ident()
    shutdown()


def register_exit_hooks() -> None:
    """``shutdown`` at exit: with ``atexit`` once per process (a forked child inherits it), and in
    a multiprocessing child, which leaves through ``os._exit`` after running its finalizers and
    never runs atexit, as a finalizer (under the lifecycle lock)."""
    global _previous_hook
    if not process.exit_hook:
        process.exit_hook = True
        atexit.register(shutdown_at_exit)
        if sys.excepthook is not _note_exit_error:
            _previous_hook, sys.excepthook = sys.excepthook, _note_exit_error
    if process.exit_finalizer is not None:
        return
    try:
        import multiprocessing
        from multiprocessing import util

        if multiprocessing.parent_process() is None:
            return
        process.exit_finalizer = util.Finalize(None, shutdown_at_exit, exitpriority=100)
    except Exception as exc:
        report_internal_error("multiprocessing exit hook", exc)


def force_flush(timeout: float = 10.0) -> bool:
    """Block until everything flushed so far has reached the backends and the endpoint."""
    runtime = installed()
    if runtime is None:
        return True
    gpu_done = runtime.tracing.force_flush(int(timeout * 1000))
    return runtime.thread.flush(timeout) and gpu_done


def dropped_points() -> int:
    """Points this process could not queue or export so far (after ``shutdown``: in its last run,
    including what shutdown could not drain)."""
    runtime = installed()
    return process.dropped_before_shutdown if runtime is None else runtime.thread.dropped_total


def write_report(timeout: float = 75.0) -> str | None:
    """Have this experiment's sink write its report page now and return the page's path.

    First waits until what this process flushed has reached the sink; the page then holds every
    step the sink finalized. Needs a sink control URL (the embedded sink, ``rankscope run``, or
    ``RANKSCOPE_SINK_CONTROL``) and the ``report`` view among the experiment's views (or a sink
    run with ``--report``). Otherwise, or when the sink cannot be reached, warns and returns None:
    a report never stops the job."""
    runtime = started()
    if runtime is None:
        return None
    force_flush(min(timeout, runtime.shutdown_timeout))
    control = getattr(runtime.thread.sender, "control_url", None)
    if control is None:
        warn(
            "rankscope: write_report needs this experiment's sink (the embedded sink of a multi-process job, "
            "rankscope run, or RANKSCOPE_SINK_CONTROL); a lone process writes its report view at shutdown"
        )
        return None
    experiment = str(runtime.resource.attributes[attr.EXPERIMENT_ID])
    try:
        paths = request_report(
            control, experiment, timeout, str(runtime.resource.attributes.get(attr.RUN_ID) or "") or None
        )
    except (OSError, RuntimeError) as exc:
        warn(f"rankscope: no report: {exc}")
        return None
    if paths:
        process.notices.reported = paths[0]
    return paths[0] if paths else None
