"""torchtitan: its metrics and its traced phases land in the rankscope experiment.

Through torchtitan's two extension points, on every rank:

- ``RankscopeMetricsProcessor``: a ``MetricsProcessor`` (its ``Config.build`` is how a trainer
  config picks the class) whose logger container also holds a ``RankscopeLogger`` *on every rank*:
  torchtitan logs from one rank only, rankscope reduces across ranks itself, so each rank's
  numbers (loss, grad norm, tokens/s, MFU, memory, data loading) are kept per rank and reduced
  per step by the sink (``REDUCES``: maxima for memory, times and the max loss, sums for
  allocation retries and OOMs, means otherwise). A unit in a key becomes a suffix, as metric
  names allow: ``throughput(tps)`` is recorded as ``throughput_tps``, ``mfu(%)`` as ``mfu_pct``.

      from rankscope.torchtitan import RankscopeMetricsProcessor
      config.metrics = RankscopeMetricsProcessor.Config(log_freq=10)

- ``register_handler``: a structured-logger handler factory. With
  ``TITAN_STRUCT_LOGGER_HANDLERS=torchtitan.observability.structured_logger.jsonl_handler.register_jsonl_handler,rankscope.torchtitan.register_handler``
  each ``log_trace_span`` (``fetching_batch``, ``optim``, ...) becomes a span of the step's trace
  with its ``…/total_duration_avg_s`` and ``_max_s``, and each ``log_trace_scalar`` a metric.

torchtitan's step (``set_step``, read from its records and its logs) drives rankscope's: step N
is closed (``flush``) when a record or a log of a later step arrives, and at ``close``.
Needs ``torchtitan`` (read from 0.3.0); rankscope itself does not, and imports it only here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor

from ..api import Tracer
from ..core.errors import report_internal_error
from ..metrics.recording import record_logged
from ..metrics.reduce import Reduce
from .stepping import StepFollower

SOURCE = "rankscope.torchtitan"
"""How warnings name this adapter: the short name users import (``rankscope.torchtitan``)."""

REDUCES: Mapping[str, Reduce] = {
    "loss_metrics/global_max_loss": Reduce.MAX,
    "memory/num_alloc_retries": Reduce.SUM,
    "memory/num_ooms": Reduce.SUM,
}
_MAX_PREFIXES = ("memory/", "time_metrics/", "validation_metrics/memory/")


def reduce_for(key: str, reduces: Mapping[str, Reduce] | None = None) -> Reduce:
    """The reduce type of one of torchtitan's keys: ``reduces``', else ``REDUCES``', else MAX for
    memory and times (the slowest or fullest rank is the one that matters), else MEAN."""
    if reduces and key in reduces:
        return reduces[key]
    if key in REDUCES:
        return REDUCES[key]
    return Reduce.MAX if key.startswith(_MAX_PREFIXES) else Reduce.MEAN


follower = StepFollower()  # one per process, as torchtitan's step is


class RankscopeLogger(BaseLogger):  # type: ignore[misc]
    """A torchtitan logger that records each value at torchtitan's step, on every rank."""

    def __init__(self, reduces: Mapping[str, Reduce] | None = None) -> None:
        self._reduces = dict(reduces or {})

    def log(self, metrics: dict[str, Any], step: int) -> None:
        try:
            follower.follow(step)
        except Exception as exc:  # telemetry never breaks the training loop
            report_internal_error("torchtitan step", exc)
        for key, value in metrics.items():
            record_logged(key, value, reduce_for(key, self._reduces), source=SOURCE)

    def close(self) -> None:
        follower.close()


class RankscopeMetricsProcessor(MetricsProcessor):  # type: ignore[misc]
    """torchtitan's ``MetricsProcessor``, plus a ``RankscopeLogger`` on every rank."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):  # type: ignore[misc]
        rankscope_reduces: dict[str, str] = field(default_factory=dict)
        """Reduce type by key (``{"throughput(tps)": "sum"}``), over ``rankscope.torchtitan.REDUCES``."""

    def _build_metric_logger(self, *, config: Config, **kwargs: Any) -> Any:
        built = super()._build_metric_logger(config=config, **kwargs)  # TensorBoard/W&B on the metrics rank
        container = built if isinstance(built, LoggerContainer) else LoggerContainer()
        if container is not built and type(built) is not BaseLogger:
            container.add_logger(built)
        reduces = {key: Reduce.get(name) for key, name in config.rankscope_reduces.items()}
        container.add_logger(RankscopeLogger(reduces))
        return container


class RankscopeHandler(logging.Handler):
    """torchtitan's structured records as rankscope's: a span per ``log_trace_span``, a metric per
    ``log_trace_scalar``. Spans nest per asyncio task, as torchtitan pairs them."""

    def __init__(self, reduces: Mapping[str, Reduce] | None = None) -> None:
        super().__init__()
        self._reduces = dict(reduces or {})
        self._open: dict[str | None, list[_OpenSpan]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._take(record)
        except Exception as exc:  # telemetry never breaks the training loop
            report_internal_error("torchtitan structured record", exc)

    def close(self) -> None:
        follower.close()
        super().close()

    def _take(self, record: logging.LogRecord) -> None:
        kind = getattr(record, "log_type", None)
        name = getattr(record, "log_type_name", None)
        if not isinstance(name, str):
            return
        follower.follow(getattr(record, "step", None))
        if kind == "event":
            base, _, end = name.rpartition("_")
            stack = self._open.setdefault(getattr(record, "task_name", None), [])
            if end == "start":
                stack.append(_OpenSpan(base, Tracer(base).start()))
            elif stack and stack[-1].name == base and end == "error":
                stack[-1].error = RuntimeError(record.getMessage())
            elif stack and stack[-1].name == base and end == "end":
                span = stack.pop()
                span.tracer.stop(span.error)
        elif kind == "instant" and name == "metric_value":
            key = getattr(record, "event_name", None)
            if isinstance(key, str):
                value = getattr(record, "value", None)
                record_logged(key, value, self._reduces.get(key, Reduce.MEAN), source=SOURCE)


class _OpenSpan:
    __slots__ = ("error", "name", "tracer")

    def __init__(self, name: str, tracer: Tracer) -> None:
        self.name = name
        self.tracer = tracer
        self.error: BaseException | None = None


def register_handler(*, structured_logger: logging.Logger, **_: Any) -> None:
    """torchtitan's handler-factory signature (``TITAN_STRUCT_LOGGER_HANDLERS``)."""
    structured_logger.addHandler(RankscopeHandler())
