"""The ``otlp`` view: each step of the global view sent to an OTLP endpoint (a Collector) as gauges.

Config keys: ``endpoint`` (required: the Collector's OTLP receiver, ``http://host:port``; the
shipped ``collector-config/remote-write.yaml`` listens on ``http://127.0.0.1:4327``),
``protocol`` (``grpc``, the default, or ``http/protobuf``), ``timeout`` (seconds one request
may take, default 10), ``max_buffered`` (steps held while the endpoint does not take them,
default 600: 10 minutes at 1 step/s), ``max_backoff`` (seconds between tries at most, default
30), ``finish_timeout`` (seconds ``finish`` waits for the buffer to drain, default 8: under the
sink's stop timeout).

Only the global view, and only steps as they are finalized: a late update (a step corrected
after it was written) is not sent, because a gauge's sample at an earlier time than the last is
out of order for Prometheus; it is counted (``late_updates`` in the status) and the JSONL view
and the report hold the corrected value. Names and attributes: ``gauges``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..base import LoggerBackend, LoggingMode, Metric
from .gauges import Gauges

FINISH_TIMEOUT = 8.0
"""Seconds ``finish`` waits for the buffer to drain by default: under the sink's 10 s stop timeout."""
ROLE_PROBES = 64
"""Processes whose values are read, at a step with keys new to the view, to learn who records them."""


class OtlpBackend(LoggerBackend):
    descriptors = 1
    """The connection to the endpoint (the sink's descriptor budget)."""

    def __init__(self, logger_backend_config: dict[str, Any] | None = None) -> None:
        config = {"logging_mode": LoggingMode.GLOBAL_REDUCE.value, **(logger_backend_config or {})}
        super().__init__(config)
        c = self.logger_backend_config
        if self.logging_mode is not LoggingMode.GLOBAL_REDUCE:
            raise ValueError("the otlp backend sends the global view only (logging_mode global_reduce)")
        self.endpoint = str(c.get("endpoint") or "")
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(
                'the otlp backend needs "endpoint": the OTLP receiver of a Collector, e.g. '
                '{"otlp": {"endpoint": "http://127.0.0.1:4327"}} (collector-config/remote-write.yaml)'
            )
        self.protocol = str(c.get("protocol", "grpc"))
        if self.protocol not in ("grpc", "http/protobuf"):
            raise ValueError(f"the otlp backend's protocol is grpc or http/protobuf, not {self.protocol!r}")
        self.timeout = float(c.get("timeout", 10.0))
        self.max_buffered = int(c.get("max_buffered", 600))
        self.max_backoff = float(c.get("max_backoff", 30.0))
        self.finish_timeout = float(c.get("finish_timeout", FINISH_TIMEOUT))
        if min(self.timeout, self.max_backoff, self.finish_timeout) <= 0 or self.max_buffered < 2:
            raise ValueError("otlp backend: timeout, max_backoff and finish_timeout must be > 0, max_buffered >= 2")
        self.sender: Any = None
        """The ``sender.Sender``; None before ``init`` and after ``finish``."""
        self._gauges: Gauges | None = None
        self._roles: dict[str, str] = {}
        """Key -> the roles (comma-separated) whose processes recorded it; "" for none found."""
        self._late_updates = 0
        self._last_ms = 0
        """The last sample's time (ms): each step's is later, as Prometheus keeps one sample a millisecond."""
        self._final: dict[str, Any] | None = None

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        from .sender import Sender, Transport

        experiment = str(kwargs.get("experiment") or process_name or "rankscope")
        run = str(kwargs.get("run") or "")
        self._gauges = Gauges(experiment, run)
        who = f"{experiment[:64]!r}" + (f" run {run[:64]!r}" if run else "")
        transport = Transport(self.endpoint, self.protocol, self.timeout)
        self.sender = Sender(transport, name=who, max_buffered=self.max_buffered, max_backoff=self.max_backoff)
        self.location = f"{self.endpoint} ({self.protocol})"

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.sender is None or self._gauges is None or global_step is None:
            return
        if kwargs.get("late"):
            self._late_updates += 1
            return
        if any(m.key not in self._roles for m in metrics):
            self._learn_roles(metrics, kwargs.get("per_process") or {})
        seconds = kwargs.get("step_seconds")
        closed = kwargs.get("finalized_at")
        when_ms = int((closed if isinstance(closed, (int, float)) else time.time()) * 1000)
        self._last_ms = when_ms = max(when_ms, self._last_ms + 1)  # Prometheus: one sample per ms
        payload, points = self._gauges.request(
            global_step,
            ((m.key, float(m.value)) for m in metrics),
            self._roles,
            when_ms * 1_000_000,
            float(seconds) if isinstance(seconds, (int, float)) else None,
        )
        self.sender.put(payload, points)

    def _learn_roles(self, metrics: list[Metric], per_process: Mapping[Any, list[Metric]]) -> None:
        """Who records the keys new in this step: the values of up to ``ROLE_PROBES`` processes
        (the first of each role first) are read; a key none of them holds has no role."""
        new = {m.key for m in metrics if m.key not in self._roles}
        found: dict[str, set[str]] = {}
        by_role: dict[str, list[Any]] = {}
        for process in per_process:
            by_role.setdefault(str(getattr(process, "role", "")), []).append(process)
        order = [p for ps in by_role.values() for p in ps[:1]] + [p for ps in by_role.values() for p in ps[1:]]
        for process in order[:ROLE_PROBES]:
            role = str(getattr(process, "role", ""))
            for metric in per_process[process]:
                if metric.key in new:
                    found.setdefault(metric.key, set()).add(role)
        for key in new:  # the sink's own keys (rankscope/..., straggler/...) have no role: ""
            self._roles[key] = ",".join(sorted(found.get(key, ())))

    def health(self) -> dict[str, Any] | None:
        """The sender's counts, for the sink's status route (another thread: ``finish`` may run)."""
        sender = self.sender
        if sender is None:
            return self._final
        return {**sender.status(), "late_updates": self._late_updates}

    def finishing(self) -> None:
        if self.sender is not None:
            self.sender.begin_close(self.finish_timeout)

    def finish(self) -> None:
        sender = self.sender
        if sender is None:
            return
        sender.close(self.finish_timeout)
        self._final = {**sender.status(), "late_updates": self._late_updates}
        self.sender = None
