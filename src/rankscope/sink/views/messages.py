"""What a run's views are handed (``views.writer.ViewWriter``'s inbox): typed messages, and the
kind of data each carries, by which a dropped one is counted (``DROP_KINDS``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ...backends.base import Metric
from ...core.anomalies import Anomaly
from ...otlp.samples import SampleRow
from ..checked import LogRecord, Process
from .step import StepView

DROP_KINDS = ("step_views", "late_updates", "streamed_values", "sample_rows", "log_records", "anomaly_records")
"""What a run's views may drop, by kind of data (the status route's ``view_drops``)."""


@dataclass(slots=True)
class Finalized:
    view: StepView


@dataclass(slots=True)
class Stream:
    process: Process
    metric: Metric
    step: int | None


@dataclass(slots=True)
class Detected:
    """An anomaly record outside a step's view (a capture's files)."""

    record: Anomaly
    step: int | None


@dataclass(slots=True)
class Row:
    process: Process
    row: SampleRow
    """A streamed sample row."""


@dataclass(slots=True)
class Log:
    process: Process
    record: LogRecord
    """An ordinary OTel log record."""
    step: int


@dataclass(slots=True)
class Report:
    status: dict[str, Any] | None
    done: threading.Event = field(default_factory=threading.Event)
    paths: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Sync:
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True)
class Close:
    """Finish the backends after what is queued (W&B's finish can take seconds)."""


@dataclass(slots=True)
class Release:
    """Finish the backends after what is queued and give their files back; the next message that
    needs them opens them again (the sink's descriptor budget, ``durable.descriptors``)."""


Data = Finalized | Stream | Detected | Row | Log | Report
"""What is written to the views (``views.writes.Writes``)."""
Message = Data | Sync | Close | Release


def kind_of(message: Message) -> str | None:
    """The kind of data a message carries (``DROP_KINDS``); None for the writer's own control messages."""
    match message:
        case Finalized(view):
            return "late_updates" if view.late else "step_views"
        case Stream():
            return "streamed_values"
        case Row():
            return "sample_rows"
        case Log():
            return "log_records"
        case Detected():
            return "anomaly_records"
    return None
