"""Export rounds and the shutdown's drain: how what this process holds leaves it, and when shutdown stops trying.

The export thread decides *when* a round runs (its cadence, a flush, a poll, the stop); a round
encodes the new steps behind the held ones and lets each outbox send, in the sink's order, until one
fails (the endpoint backs off) or all are out. At shutdown the drain runs rounds, with the same
backoff, until ``RANKSCOPE_SHUTDOWN_TIMEOUT`` (longer for a sink this job owns, ``OWNED_SINK_DRAIN``),
then counts what is left. Kept apart from the thread so the scheduling reads on its own and the
retry and deadline rules live in one place.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..metrics.recorder import Recorder, StepBatch
from .drops import Drops
from .endpoint import Endpoint
from .outboxes import MetricOutbox, Outbox, RowOutbox, StepBound
from .senders import EmbeddedSender, RelaySender, Sender

OWNED_SINK_DRAIN = 30.0
"""Seconds a shutdown keeps retrying a sink this job owns while it is alive but has not taken what
this process holds (a busy box): past ``RANKSCOPE_SHUTDOWN_TIMEOUT``, counted from when the sink was ready."""


class _Pause:
    """Between encoded steps, hands the GIL back to the training thread once ``every`` seconds of
    encoding have passed since the round began or the last hand-back. Handing it back after every
    step left each step to be encoded on caches the training thread had just used (~25 % more of
    the export thread's CPU per step, ``bench_overhead.py``). A training thread that wants the GIL
    while steps are encoded waits about 0.5 ms at most (one step's encoding more; the round's spans
    and sends are not paused, as before; Python's own switch interval is 5 ms)."""

    __slots__ = ("_every", "_since")

    def __init__(self, every: float = 0.0005) -> None:
        self._every = every
        self._since = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self._since >= self._every:
            time.sleep(0)
            self._since = time.perf_counter()


class Rounds:
    """The export thread's rounds (encode, send, back off) and its drain at shutdown; export thread only,
    except ``expect_drain`` and ``drain_until`` (``ExportThread.shutdown``)."""

    def __init__(
        self,
        *,
        recorder: Recorder,
        sender: Sender | None,
        endpoint: Endpoint | None,
        bound: StepBound,
        drops: Drops,
        outboxes: tuple[Outbox, ...],
        metrics: MetricOutbox,
        rows: RowOutbox,
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        self._recorder = recorder
        self._sender = sender
        self._endpoint = endpoint
        self._bound = bound
        self._drops = drops
        self._outboxes = outboxes
        """In the sink's order (``ExportThread``): a step's spans and rows before its flush marker."""
        self._metrics = metrics
        self._rows = rows
        self._on_error = on_error
        self._goodbye_queued = False
        self.drain_until = 0.0
        """How long ``shutdown`` waits for the export thread (the drain moves it, with a sink this job owns)."""

    def held(self) -> bool:
        """Anything encoded or relayed but not sent yet (a failed attempt's, or a child's)."""
        return any(outbox.held() for outbox in self._outboxes)

    def run(self, pending: list[StepBatch], deadline: float | None, goodbye: bool) -> None:
        """One round over ``pending`` (the new steps); a bug in it is reported and backed off, never raised."""
        if self._endpoint is not None:
            self._endpoint.start_round()
        try:
            self._round(pending, deadline, goodbye)
        except Exception as exc:
            if self._endpoint is not None:
                self._endpoint.after_bug()
            self._on_error("export", exc)

    def expect_drain(self, asked: float, timeout: float) -> None:
        """Shutdown asked at ``asked``: how long it waits for the drain, before the drain itself moves it."""
        owned = isinstance(self._sender, EmbeddedSender)
        self.drain_until = asked + (max(timeout, OWNED_SINK_DRAIN) if owned else timeout)

    def drain(self, pending: list[StepBatch], asked: float, timeout: float) -> None:
        """Stop: keep trying (with the same backoff) until the shutdown deadline, then count what is left.

        With a sink this job owns, the drain counts from when the sink was ready (its starter waits
        for it to start: that is not time spent on the endpoint), and what it did not take in time
        (a busy box: DEADLINE_EXCEEDED) is retried past the deadline while the sink is alive, up to
        ``OWNED_SINK_DRAIN``: only a sink that is gone, or still busy after that, loses it."""
        sink = self._sender if isinstance(self._sender, EmbeddedSender) else None
        extended = False
        while True:
            deadline, longest = self._deadlines(asked, timeout, sink)
            self.run(pending, longest if extended else deadline, True)
            pending = []
            if not self.held() or self._endpoint is None:
                break
            deadline, longest = self._deadlines(asked, timeout, sink)  # the round may have started the sink
            wait = max(0.0, self._endpoint.next_attempt - time.monotonic())
            after = time.monotonic() + wait
            if after >= (longest if extended else deadline) - 0.05:
                if extended or sink is None or after >= longest - 0.05 or not sink.alive():
                    break
                extended = True  # alive but slow: retried, its attempts may take until the drain's end
            time.sleep(wait)
        if self.held():
            for outbox in self._outboxes:
                outbox.abandon("shutdown ended before the endpoint answered")
            self._drops.report(final=True)

    def _deadlines(self, asked: float, timeout: float, sink: EmbeddedSender | None) -> tuple[float, float]:
        """(the drain's deadline, the longest it may go on while a sink this job owns is alive), and
        tells ``shutdown`` how long to wait for the export thread."""
        if sink is None:
            return asked + timeout, asked + timeout
        begun = max(asked, sink.ready_at or 0.0)
        deadline, longest = begun + timeout, begun + max(timeout, OWNED_SINK_DRAIN)
        self.drain_until = max(self.drain_until, longest)
        return deadline, longest

    def _round(self, batches: list[StepBatch], deadline: float | None, goodbye: bool) -> None:
        """One export round: encode the new steps behind the held ones, then let each outbox send,
        in order, until one fails (then back off) or all are out."""
        endpoint = self._endpoint
        if endpoint is None:  # local backends only: nothing leaves the process
            self._bound.release(len(batches), sum(b.held_points for b in batches))
            self._recycle(batches)
            return
        try:
            self._encode(batches, goodbye)
        except Exception:
            self._bound.release(len(batches), sum(b.held_points for b in batches))
            self._drops.points(sum(len(b.accs) for b in batches), "a step could not be encoded")
            rows = sum(len(t.distinct()) for b in batches for t in b.samples or ())
            self._drops.lose_rows(rows, "a step could not be encoded")
            raise
        self._recycle(batches)
        for outbox in self._outboxes:
            failed = outbox.send(endpoint, deadline)
            if failed is not None:
                endpoint.failed(failed)
                return
        endpoint.recovered()
        self._drops.report(final=False)

    def _encode(self, batches: list[StepBatch], goodbye: bool) -> None:
        # A forked child (relayed) is never waited for by a sink: no goodbye to say.
        goodbye = goodbye and not self._goodbye_queued and not isinstance(self._sender, RelaySender)
        if not batches and not goodbye:
            return
        self._metrics.add_steps(batches, goodbye, pause=_Pause())
        for batch in batches:
            if batch.samples:
                self._rows.select(batch)
        self._goodbye_queued = self._goodbye_queued or goodbye

    def _recycle(self, batches: list[StepBatch]) -> None:
        """The steps' accumulators, encoded and seen by the local views, serve later steps' first
        values (``Recorder.recycle``); the batches are not read again."""
        for batch in batches:  # the newest last: the next take pops it first (its keys are the likeliest)
            self._recorder.recycle(batch.accs)
            batch.accs = {}
