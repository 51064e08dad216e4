"""A process's side of capture on anomaly: poll the sink, profile the asked steps, upload the trace.

The export thread calls ``service()`` once per loop: at most every ``poll_interval`` seconds it
asks the sink's control route for requests addressed to this process (one small GET with a
0.5 s deadline, every 30 s while the sink does not answer; nothing when no sink control URL is
known: an external Collector or endpoint without ``RANKSCOPE_SINK_CONTROL``) and sends captures
this process asked for (``rs.capture``). The caller's thread meets it at ``flush``
(``at_flush``): an attribute check when idle; with a request waiting, ``torch.profiler`` starts
there (CPU, and CUDA where present; on a box without CUDA, Kineto's own lines about the missing
GPU are kept out of the job's output) and stops after the asked number of steps (stopping parses
the recorded events: it can take a moment on the caller's thread), each step marked as a
``rankscope.step N`` range in the trace and the capture as a ``rankscope.capture`` event in the
step's trace. The Chrome trace is written, gzipped and uploaded on a thread of its own. A
profiler still running at shutdown is stopped and its capture dropped; a finished one is still
sent, and shutdown waits for the uploads under way (``finish``, bounded by the shutdown timeout),
so a capture of a job's last steps is not lost with the process. Forked children are never profiled.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import random
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from ..core import names as attr
from ..core.paths import safe_component

log = logging.getLogger("rankscope")

ASK_PATIENCE_S = 60.0
"""How long a capture request is asked again (each second) while the sink knows nothing of the
experiment: it learns it from the first request of any process of the job (asked at step 0, or by
a driver that records nothing)."""


class Captures:
    """One process's capture requests, its running profiler and its finished traces."""

    def __init__(
        self,
        control: Callable[[], str | None],
        experiment: str,
        process_id: str,
        *,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        poll_interval: float = 2.0,
        label: str = "process",
        control_coming: Callable[[], bool] = lambda: False,
    ) -> None:
        self._control = control
        self._control_coming = control_coming
        """Whether ``control``, None now, is still to come (the job's own sink, being found or
        started): requests wait for it."""
        self.experiment = experiment
        self.process_id = process_id
        self.experiment_dir = safe_component(experiment)
        self.file_name = f"{safe_component(label)}.pt.trace.json.gz"
        """The sink's name for this process's trace (``sink.views.captures``): the capture event names it."""
        self.poll_interval = poll_interval
        self._on_event = on_event
        self._next_poll = 0.0
        self._asked: deque[dict[str, Any]] = deque()
        """Requests picked up from the sink, waiting for the next flush (caller's thread takes them)."""
        self._ours: deque[tuple[float, dict[str, Any]]] = deque()
        """Captures this process asks for (``rs.capture``), posted on the export thread (with when
        asked: a sink that does not know the experiment yet is asked again, ``ASK_PATIENCE_S``)."""
        self._next_ask = 0.0
        self._finished: deque[tuple[str, Any]] = deque()
        """(capture id, stopped profiler) whose trace the export thread writes and uploads."""
        self._running: tuple[str, Any, Any, int] | None = None
        """(capture id, profiler, the open step range, steps left) while profiling."""
        self.uploaded: list[str] = []
        self._uploads: list[threading.Thread] = []
        """Uploads under way (``finish`` waits for them)."""
        self._lock = threading.Lock()

    # -- caller's thread -----------------------------------------------------------------

    def at_flush(self, step: int) -> None:
        """At the flush of ``step``: mark the running profiler's step, stop it when done, or start a
        waiting one (it then profiles steps ``step + 1`` to ``step + N``, each a ``rankscope.step N``
        range in the trace)."""
        running = self._running
        if running is None and not self._asked:
            return
        try:
            if running is not None:
                capture_id, profiler, marks, left = running
                marks.__exit__(None, None, None)
                profiler.step()
                if left > 1:
                    self._running = (capture_id, profiler, _mark(step + 1), left - 1)
                    return
                profiler.stop()
                self._running = None
                self._finished.append((capture_id, profiler))
                if self._on_event is not None:  # where the sink puts the file, under its artifact directory
                    where = f"{self.experiment_dir}/captures/{safe_component(capture_id)}/{self.file_name}"
                    self._on_event(attr.CAPTURE_EVENT, {attr.CAPTURE_ID: capture_id, attr.CAPTURE_FILE: where})
                return
            request = self._asked.popleft()
            profiler = _start_profiler()
            self._running = (str(request["id"]), profiler, None, int(request["steps"]))  # abort() can stop it
            self._running = (str(request["id"]), profiler, _mark(step + 1), int(request["steps"]))
        except Exception as exc:  # a profiler that will not start or stop: this capture is lost, the job goes on
            self.abort()
            log.warning("rankscope: profiler capture failed (%s: %s)", type(exc).__name__, exc)

    def abort(self) -> None:
        """Stop a running profiler and drop its capture (an error, or shutdown mid-capture)."""
        running, self._running = self._running, None
        if running is None:
            return
        with contextlib.suppress(Exception):
            if running[2] is not None:
                running[2].__exit__(None, None, None)
        with contextlib.suppress(Exception):
            running[1].stop()

    def ask(self, reason: str, steps: int, ranks: list[int] | None) -> None:
        """``rs.capture``: ask the sink for a capture (sent on the export thread)."""
        body = {"experiment": self.experiment, "reason": reason, "steps": steps, "ranks": ranks}
        self._ours.append((time.monotonic(), body))

    # -- export thread -------------------------------------------------------------------

    def service(self) -> None:
        """Post our requests, poll for requests to us, upload finished traces (export thread)."""
        control = self._control()
        if control is None:
            if self._ours and not self._control_coming():
                self._ours.clear()
                log.warning(
                    "rankscope: rs.capture needs a sink: the job's own (none could be reached) or the one "
                    "RANKSCOPE_SINK_CONTROL names; not sent"
                )
            return
        now = time.monotonic()
        while self._ours and now >= self._next_ask:
            asked, body = self._ours[0]
            answer = _request(control, "POST", "/rankscope/v1/captures", {}, json.dumps(body).encode())
            if _unknown_yet(answer) and now - asked < ASK_PATIENCE_S:
                self._next_ask = now + 1.0  # the sink learns the experiment from its first request
                break
            self._ours.popleft()
            if answer is None or "id" not in answer:
                log.warning("rankscope: the sink did not take the capture request (%s)", answer)
        if now >= self._next_poll:
            query = {"experiment": self.experiment, "process": self.process_id}
            found = _request(control, "GET", "/rankscope/v1/captures", query, timeout=0.5)
            if isinstance(found, list):
                self._asked.extend(r for r in found if isinstance(r, dict) and "id" in r and "steps" in r)
            wait = self.poll_interval if isinstance(found, list) else 30.0  # an unreachable sink: rarely
            self._next_poll = now + wait * random.uniform(0.8, 1.2)
        self._send_finished(control)

    def finish(self, timeout: float) -> None:
        """At shutdown, once the export thread has stopped: drop a capture still profiling, send the
        finished ones and wait up to ``timeout`` seconds for every upload under way."""
        self.abort()
        if self._ours:
            log.warning(
                "rankscope: %d capture request(s) not sent: the sink did not know experiment %r yet",
                len(self._ours),
                self.experiment[:64],
            )
            self._ours.clear()
        control = self._control()
        if control is not None:
            self._send_finished(control)
        deadline = time.monotonic() + timeout
        for upload in self._uploads:
            upload.join(max(0.0, deadline - time.monotonic()))
        left = sum(upload.is_alive() for upload in self._uploads)
        if left:
            log.warning("rankscope: %d capture upload(s) not done %.0f s into shutdown; not sent", left, timeout)

    def _send_finished(self, control: str) -> None:
        """Write and send each finished trace on a thread of its own: never stall the export."""
        self._uploads = [upload for upload in self._uploads if upload.is_alive()]
        while self._finished:
            capture_id, profiler = self._finished.popleft()
            upload = threading.Thread(
                target=self._upload, args=(control, capture_id, profiler), name="rankscope-capture", daemon=True
            )
            upload.start()
            self._uploads.append(upload)

    def _upload(self, control: str, capture_id: str, profiler: Any) -> None:
        handle, name = tempfile.mkstemp(suffix=".pt.trace.json")
        os.close(handle)
        try:
            profiler.export_chrome_trace(name)
            with open(name, "rb") as raw:
                data = gzip.compress(raw.read(), compresslevel=6)
            query = {"experiment": self.experiment, "capture": capture_id, "process": self.process_id}
            answer = _request(control, "PUT", "/rankscope/v1/captures/file", query, data, timeout=60.0)
            if answer is not None and "path" in answer:
                self.uploaded.append(str(answer["path"]))
            else:
                log.warning("rankscope: the sink did not take capture %s (%s)", capture_id, answer)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            log.warning("rankscope: capture %s could not be written or sent (%s)", capture_id, why)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(name)


def _mark(step: int) -> Any:
    from torch.profiler import record_function

    marks = cast(Any, record_function(f"{attr.STEP} {step}"))  # torch leaves its __enter__ untyped
    marks.__enter__()
    return marks


def _start_profiler() -> Any:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
        quiet = None
    else:
        # Kineto looks for GPUs whatever it is asked to trace and, on a box without CUDA, prints
        # "gpuGetDeviceCount failed with code 35" (and its USDT lines) into the job's output. It
        # reads its log level once, at its first start: hush it for that start, unless the user
        # chose a level; the variable is put back after, so processes started later are unaffected.
        quiet = "KINETO_LOG_LEVEL" not in os.environ
        if quiet:
            os.environ["KINETO_LOG_LEVEL"] = _KINETO_SILENT
    profiler = profile(activities=activities)
    try:
        profiler.start()
    finally:
        if quiet and os.environ.get("KINETO_LOG_LEVEL") == _KINETO_SILENT:
            del os.environ["KINETO_LOG_LEVEL"]
    return profiler


_KINETO_SILENT = "6"
"""Above Kineto's highest level (errors are 4, its USDT marks 5): nothing printed."""


def _unknown_yet(answer: Any) -> bool:
    """The sink's answer to a request for an experiment it has no data of yet (404)."""
    return isinstance(answer, dict) and str(answer.get("error", "")).startswith("404:")


def _request(
    control: str, method: str, path: str, query: dict[str, str], body: bytes | None = None, timeout: float = 2.0
) -> Any:
    """One call to the sink's control routes; its JSON answer, or None (logged at debug) on trouble."""
    url = f"{control.rstrip('/')}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request = urllib.request.Request(url, data=body, method=method)
    token = os.environ.get("RANKSCOPE_SINK_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # the sink's reason (a rate limit, an unknown capture)
        return {"error": f"{exc.code}: {exc.read()[:300].decode(errors='replace')}"}
    except Exception as exc:
        log.debug("rankscope: %s %s failed: %r", method, path, exc)
        return None
