"""What a view is handed: a finished step (``StepView``) and a sample row as a table entry (``entry``).

The step book builds a ``StepView`` (``book.finalize.view_of``) and the writer (``views.writer``)
writes it; it lives here, with the views, so the views import nothing of the book.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ...backends.base import Metric, sample_entry
from ...core.anomalies import Anomaly, Outlier, Straggler
from ...otlp.samples import SampleRow
from ..checked import Process


class StepView:
    """A finished step: the global values, each process's values (computed on first use), who was missing."""

    def __init__(
        self,
        experiment: str,
        step: int,
        seq: int,
        global_metrics: list[Metric],
        missing: list[str],
        late: bool,
        per_process: Mapping[Process, list[Metric]] | None = None,
        *,
        labels: dict[str, str] | None = None,
        samples: dict[str, list[dict[str, Any]]] | None = None,
        anomalies: list[Anomaly] | None = None,
        heat: dict[str, dict[str, float]] | None = None,
        phase_times: dict[str, dict[Process, float]] | None = None,
        spans: list[Any] | None = None,
    ) -> None:
        self.experiment, self.step, self.missing, self.late = experiment, step, missing, late
        self.finalized_at = time.time()
        """When the sink finalized it (Unix seconds; a step replayed after a restart: when replayed)."""
        self.away = 0
        """How many of ``missing`` (its last) were named at an earlier step: counted, not warned of again."""
        self.heat = heat or {}
        """Seconds per phase per process label (at most ``HEAT_PROCESSES`` of them): ``rankscope top``."""
        self.phase_times = phase_times or {}
        """Seconds per phase per process, every process: the report's heat map."""
        self.spans = spans or []
        """The step's stored spans (``book.traces.StoredSpan``) when it was finalized: the report's Gantt."""
        self.anomalies = anomalies or []
        """What the detectors found in this step (``sink.views.anomalies``)."""
        self.stragglers: list[tuple[Straggler, Process]] = []
        """Each straggler record with the process it names: whom the service may ask to profile."""
        self.outliers: list[tuple[Outlier, Process]] = []
        """Each outlier record with the process it names, when the detector asks for captures
        (``Thresholds.outlier_capture``)."""
        self.samples = samples or {}
        """Each sample table's kept rows (``sample_entry`` dicts); a late update: tables that changed."""
        self.global_metrics = global_metrics
        self.labels = labels or {}
        """Process labels of values that name a process (``{key}/argmax_rank``): the console shows them."""
        self.seq = seq
        self.carried: Mapping[int, int] = {}
        """Time buckets this step took over, with their newest records: its write covers them too."""
        self.duration: float | None = None
        """Seconds from the previous step's first close to this one's (``book.windows``), if known:
        the step's time, as a console shows it."""
        self.from_start = False
        """``duration`` counts from its first closer's start (the run's first step, set-up and all)."""
        self.attempt = 0
        """The run's attempt when the step was finalized (what the write-ahead log's checkpoint records)."""
        self.rewound = False
        """The step comes again (a restarted or resumed run executes it again): views drop what they
        hold of this step and later ones (TensorBoard's purge step) before writing it."""
        self.per_process: Mapping[Process, list[Metric]] = per_process if per_process is not None else {}
        """Each process's values (a late update: the processes whose data came late, their late data),
        reduced on first use (``book.finalize.PerProcess``)."""


def entry(table: str, step: int | None, side: str, origin: tuple[Any, SampleRow]) -> dict[str, Any]:
    process, row = origin
    return sample_entry(
        table,
        step,
        side,
        row.row,
        time_unix_nano=row.time_unix_nano,
        trace_id=row.trace_id,
        span_id=row.span_id,
        policy_version=row.policy_version,
        process=process.label,
        role=process.role,
        replica=process.replica,
        rank=process.rank,
    )
