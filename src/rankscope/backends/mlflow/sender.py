"""The MLflow view's sender: a bounded buffer and its own thread, so that a tracking server that
is down or slow never holds up the sink's view thread (nor another view).

The view appends (``put``) and returns; the sender thread takes ``log-batch`` requests from the
buffer's head (``batches.take``), each one attempt of at most ``timeout`` seconds (``rest``).
A server that does not answer is tried again after a backoff (0.5 s doubling to ``max_backoff``,
with jitter), the request kept: nothing is lost while the buffer has room. A full buffer drops
its oldest metric points for the new ones (counted: ``dropped``, ``dropped_points``), so the
values from the server's return on are all there; params and tags wait in a buffer of their own
(``MAX_META`` entries, what comes past it dropped and counted), sent first. A request the server
refuses is dropped (counted: ``refused``; a params request is tried one param at a time first,
so that one changed param costs itself only). The first failure, the first drop and the return
of the server are each said once in the log; ``status`` says all of it to the sink's status
route. Files (anomalies, sample tables, the key map, the report page) are uploaded as the run's
artifacts at most every ``artifact_seconds`` while they change, and at the end.

``close`` drains within a deadline: what is still buffered then is dropped, counted and said;
the runs are marked finished; a thread stuck in a call is left behind (a daemon).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ..draining import Draining
from .batches import Batch, Entry, MetricPoint, take
from .rest import RefusedError, Rest, UnreachableError
from .runs import MlflowRuns

log = logging.getLogger("rankscope")

MAX_META = 10_000
"""Params and tags held while the server does not take them."""

Upload = Callable[[str, str, str], None]
"""(run id, local file, artifact directory): upload one file as an artifact of the run."""


class Sender(Draining):
    def __init__(
        self,
        rest: Rest,
        runs: MlflowRuns,
        upload: Upload,
        *,
        name: str,
        max_buffered: int = 600_000,
        max_backoff: float = 30.0,
        artifact_seconds: float = 30.0,
    ) -> None:
        where, holds = f"MLflow at {rest.uri}", f"{max_buffered} entries"
        super().__init__(view="mlflow", name=name, where=where, holds=holds, dropped=lambda: self.dropped)
        self._rest = rest
        self.runs = runs
        self._upload = upload
        self.max_buffered = max_buffered
        self.max_backoff = max_backoff
        self.artifact_seconds = artifact_seconds
        self._queue: deque[Entry] = deque()
        """Metric points, oldest first."""
        self._meta: deque[Entry] = deque()
        """Params and tags, sent before the metric points."""
        self._inflight: Batch | None = None
        """The request being sent (taken off the buffers), until the server took or refused it."""
        self._files: dict[str, str] = {}
        """Local file → artifact directory: changed since uploaded."""
        self._next_upload = 0.0
        self.sent_points = 0
        self.dropped = 0
        self.dropped_points = 0
        self.refused = 0
        self._said_drop = False
        self._thread = threading.Thread(target=self._loop, name="rankscope-mlflow", daemon=True)
        self._thread.start()

    def put(self, entries: Iterable[Entry]) -> None:
        """Append to the buffers; past ``max_buffered`` metric points the oldest is dropped for
        each new one, past ``MAX_META`` params and tags the new ones are; each counted."""
        with self._cond:
            for entry in entries:
                if self._closing:
                    self._drop(entry)
                elif isinstance(entry, MetricPoint):
                    if len(self._queue) >= self.max_buffered:
                        self._drop(self._queue.popleft())
                    self._queue.append(entry)
                elif len(self._meta) >= MAX_META:
                    self._drop(entry)
                else:
                    self._meta.append(entry)
            self._cond.notify()

    def changed(self, path: str, artifact_dir: str) -> None:
        """A local file changed: upload it (again) as an artifact, soon."""
        with self._cond:
            self._files[path] = artifact_dir
            self._cond.notify()

    def _drop(self, entry: Entry) -> None:
        self.dropped += 1
        if isinstance(entry, MetricPoint):
            self.dropped_points += 1
        if not self._said_drop:
            self._said_drop = True
            log.warning(
                "rankscope: the mlflow view of %s drops its oldest values: its buffer of %d is full "
                "while MLflow at %s does not take them (counted in the sink's status: views.mlflow.dropped)",
                self.name,
                self.max_buffered,
                self._rest.uri,
            )

    def status(self) -> dict[str, Any]:
        return {
            "tracking_uri": self._rest.uri,
            "experiment_id": self.runs.experiment_id,
            "run_id": self.runs.run_ids.get(""),
            "buffered": len(self._queue) + len(self._meta),
            "sent_points": self.sent_points,
            "dropped": self.dropped,
            "dropped_points": self.dropped_points,
            "refused": self.refused,
            "down_since": self.down_since,
            "last_error": self.last_error,
        }

    def close(self, timeout: float) -> None:
        """``begin_close``, then send what is buffered and the changed files by its deadline, mark
        the runs finished, and stop; what is left is dropped, counted and said."""
        self.begin_close(timeout)
        self.wait_closed(self._thread)
        with self._cond:
            left = [*self._meta, *self._queue]
            self._queue.clear()
            self._meta.clear()
            if self._inflight is not None:  # its entries: the points (and params or tags) it held
                self.dropped += self._inflight.entries
                self.dropped_points += self._inflight.points
                self._inflight = None
        for entry in left:
            self.dropped += 1
            self.dropped_points += isinstance(entry, MetricPoint)
        if self.dropped:
            log.warning(
                "rankscope: the mlflow view of %s dropped %d entries (%d metric points) that MLflow at %s "
                "did not take%s",
                self.name,
                self.dropped,
                self.dropped_points,
                self._rest.uri,
                f" ({self.last_error})" if self.last_error else "",
            )

    # The sender thread.

    def _loop(self) -> None:
        failures = 0
        said: str | None = None
        while True:
            with self._cond:
                while not self._pending() and not self._closing and not self._files_due():
                    self._cond.wait(self._wait())
                if self._closing and time.monotonic() >= self._deadline:
                    return
                batch = self._inflight = self._inflight or self._take()
            try:
                if batch is not None:
                    self._send(batch)
                elif self._files and (self._closing or self._files_due()):
                    self._upload_files()
                if self._closing and not self._pending() and not self._files:
                    self.runs.end()
                    return
            except UnreachableError as exc:
                failures += 1
                self.down(str(exc))
                self.sleep(min(self.max_backoff, 0.5 * 2 ** min(failures - 1, 16)) * random.uniform(0.8, 1.2))
                continue
            except Exception as exc:  # a bug, or a run MLflow refuses: it must not end the thread
                error = self.last_error = f"{type(exc).__name__}: {str(exc)[:300]}"
                if error != said:  # said once while it lasts, not at every retry
                    log.warning("rankscope: the mlflow view of %s: %s", self.name, error)
                    said = error
                self.sleep(1.0)
                continue
            failures, said = 0, None
            self.up("entries")

    def _pending(self) -> bool:
        return bool(self._inflight or self._meta or self._queue)

    def _take(self) -> Batch | None:
        """The next request, taken off its buffer (caller holds the lock)."""
        source = self._meta if self._meta else self._queue
        batch = take(source)
        if batch is not None:
            for _ in range(batch.entries):
                source.popleft()
        return batch

    def _wait(self) -> float | None:
        if self._files:
            return max(0.05, self._next_upload - time.monotonic())
        return None

    def _files_due(self) -> bool:
        return bool(self._files) and time.monotonic() >= self._next_upload

    def _send(self, batch: Batch) -> None:
        run_id = self.runs.ensure(batch.target)
        try:
            self._rest.call("POST", "runs/log-batch", batch.body(run_id))
        except RefusedError as exc:
            if batch.params and batch.entries > 1:
                self._one_param_at_a_time(batch, run_id)
            else:
                self._refused(batch.entries, exc)
        else:
            self.sent_points += batch.points
        with self._cond:
            self._inflight = None

    def _one_param_at_a_time(self, batch: Batch, run_id: str) -> None:
        for row in batch.params:
            try:
                self._rest.call("POST", "runs/log-batch", {"run_id": run_id, "params": [row]})
            except RefusedError as exc:
                self._refused(1, exc)

    def _refused(self, entries: int, exc: RefusedError) -> None:
        self.refused += entries
        if self.refused == entries:  # the first: said once, then counted
            log.warning("rankscope: MLflow at %s refused a request of %s: %s", self._rest.uri, self.name, exc)

    def _upload_files(self) -> None:
        run_id = self.runs.ensure("")
        with self._cond:
            files = dict(self._files)
            self._files.clear()
            self._next_upload = time.monotonic() + self.artifact_seconds
        for i, (path, artifact_dir) in enumerate(files.items()):
            try:
                self._upload(run_id, path, artifact_dir)
            except Exception:
                with self._cond:  # tried again later, unless it changed meanwhile (then it is queued)
                    for rest_path, rest_dir in list(files.items())[i:]:
                        self._files.setdefault(rest_path, rest_dir)
                raise
