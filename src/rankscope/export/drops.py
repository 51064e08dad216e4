"""One drop accounting for everything a process could not export.

Metric points, streamed values and sample rows that are lost (a full queue, a bound reached while
the endpoint is away, a request refused for good, shutdown before the endpoint answered) are counted
here, under one lock (callers' threads and the export thread both drop); the first loss of an
episode is a warning, and the count goes out as the ``rankscope.dropped_points`` counter of the
SDK MeterProvider this module owns, in the next metrics request, once export works again (or at
shutdown). Spans have their own counter in the span buffer (overflow counts there); refused spans
are added to it here and reported after the next span request that goes through.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricReader, MetricsData
from opentelemetry.sdk.resources import Resource

from .._version import __version__
from ..core import names as attr
from ..core.errors import warn
from ..tracing.spans import SpanBuffer
from ._otel_sdk import SdkGauge

REJECTION_KINDS = 16
"""Kinds of ``partial_success`` reason said (the rest counted, not said)."""
_DIGITS = re.compile(r"\d+")

_INSTRUMENT_TYPES = (
    Counter,
    UpDownCounter,
    Histogram,
    ObservableCounter,
    ObservableUpDownCounter,
    ObservableGauge,
    SdkGauge,
)


class _PullReader(MetricReader):
    """Collects the MeterProvider's own instruments when the export thread asks (delta)."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality=dict.fromkeys(_INSTRUMENT_TYPES, AggregationTemporality.DELTA))
        self._data: MetricsData | None = None

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        self._data = metrics_data

    def pull(self) -> MetricsData | None:
        self.collect()
        data, self._data = self._data, None
        return data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


class Drops:
    """Counts, warns about and reports what was lost (any thread)."""

    def __init__(
        self, resource: Resource, spans: SpanBuffer, target: Callable[[], str], who: str = "rankscope"
    ) -> None:
        self._reader = _PullReader()
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader], shutdown_on_exit=False)
        meter = self.meter_provider.get_meter(attr.INSTRUMENTATION_SCOPE, __version__)
        self._counter = meter.create_counter(
            attr.DROPPED_POINTS, unit="{point}", description="points rankscope could not queue or export"
        )
        self._spans = spans
        self._target = target
        self._who = who
        """How its warnings start: ``rankscope``, or ``rankscope [trainer_r1]`` in a multi-process job."""
        self._lock = threading.Lock()
        self.total = 0
        """Points and rows lost since init (``rankscope.dropped_points()``)."""
        self.rows = 0
        self._unreported = 0
        self._warned = False
        self._taken_since_loss = False
        """A request went through since the last loss: an episode of losses can end (``report``)."""
        self._spans_reported = 0
        self._spans_warned = False
        self._rejections: set[str] = set()
        """The kinds of ``partial_success`` reason said so far (``REJECTION_KINDS`` at most)."""

    def points(self, n: int, why: str, warn_first: bool = True) -> None:
        """``n`` metric points (or streamed values) lost because ``why`` (``warn_first``: the first loss
        of an episode is a warning; off at exit, where the shutdown count says it all)."""
        with self._lock:
            self.total += n
            self._unreported += n
            first = not self._warned
            self._warned = True
            self._taken_since_loss = False
        if first and n and warn_first:
            warn(
                f"rankscope: dropping metric points because {why}; the job is unaffected "
                "and the count is reported when export recovers"
            )

    def lose_rows(self, n: int, why: str) -> None:
        """``n`` sample rows lost: counted with the points (the metric), warned the first time."""
        if n <= 0:
            return
        with self._lock:
            first = not self.rows
            self.rows += n
            self.total += n
            self._unreported += n
            self._taken_since_loss = False
        if first:
            warn(f"{self._who}: dropping sample rows because {why}; the job is unaffected (counted as dropped points)")

    def lose_spans(self, n: int, detail: str) -> None:
        """``n`` spans the endpoint refused for good (export thread)."""
        self._spans.dropped += n
        if not self._spans_warned:
            self._spans_warned = True
            warn(f"{self._who}: dropping spans: the OTLP endpoint refused them ({detail})")

    def spans_went_through(self) -> None:
        """A span request was taken: say how many were lost before it (export thread)."""
        if self._spans.dropped > self._spans_reported:
            n = self._spans.dropped - self._spans_reported
            self._spans_reported = self._spans.dropped
            self._spans_warned = False
            warn(f"{self._who}: {n} spans were dropped ({self._spans.dropped} in total)")

    def rejected(self, signal: str, n: int, why: str) -> None:
        """``n`` items of a request the endpoint took in part (OTLP ``partial_success``: a sink under
        its disk floor, a run past its quota): counted as dropped at once, each kind of reason said
        once (its numbers aside), never again every round (export thread)."""
        if signal == "spans":
            self._spans.dropped += n
            self._spans_reported += n
        else:
            with self._lock:
                self.total += n
            self._counter.add(n)
        kind = _DIGITS.sub("#", why)
        if kind in self._rejections or len(self._rejections) >= REJECTION_KINDS:
            return
        self._rejections.add(kind)
        warn(
            f"{self._who}: {self._target()} refuses what this process sends: {why}; what it refuses is "
            "counted as dropped (rankscope.dropped_points(); each reason said once)"
        )

    def taken(self) -> None:
        """The endpoint took a request of values (export thread)."""
        self._taken_since_loss = True

    def report(self, final: bool) -> None:
        """Export works again (or the process shuts down): count the losses on the metric, say so once.
        Export works again only once the endpoint took a request since the last loss: one that
        refuses every request (a wrong token) is one episode, said when it starts and at the end."""
        with self._lock:
            if not final and not self._taken_since_loss:
                return
            n, self._unreported = self._unreported, 0
            self._warned = False
        if n:
            self._counter.add(n)
            if final:
                state = f"at shutdown: {self._target()} did not take them within RANKSCOPE_SHUTDOWN_TIMEOUT"
            else:
                state = "before export recovered"
            warn(f"{self._who}: {n} metric points were dropped {state} ({self.total} in total)")

    def sdk_request(self) -> bytes:
        """The MeterProvider's own instruments (the drop counter) since the last call, as a serialized request."""
        data = self._reader.pull()
        return bytes(encode_metrics(data).SerializeToString()) if data is not None else b""

    def shutdown(self) -> None:
        self.meter_provider.shutdown()
