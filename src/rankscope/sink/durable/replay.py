"""On start, what the views had not written goes back into its run: merged again, once.

``replay`` walks every run the write-ahead log holds (``WriteAheadLog.found``), has the sink
reopen it (``reopen``: which run a log is and its step book are the sink's registry's, not the
log's, so this module imports nothing of the book) and hands each record back as the checked
batch it was (``checked.ResourceBatch``). A record that fails is counted by its run and the
others go on; what the run's state refuses now, and segments set aside as corrupt, are said
(``note``), never dropped silently: each was acknowledged once.

Only runs that were open when the last sink stopped or died, or whose views had not finished when
they closed, have a log to find: a run retired when it closed left none (``durable.retired``), so
what a start reads does not grow with the sink's history. A run found with nothing to replay is
handed back as quiet, for the sink to retire at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ...otlp.markers import Marker
from ...otlp.samples import SampleRow
from ..checked import Refusals, ResourceBatch, StateRows
from .wal import ExperimentLog, WriteAheadLog, decode_record

log = logging.getLogger("rankscope.sink")


class Replaying(Protocol):
    """A run reopened from its log, as the sink hands it back (``sink.runs.tenant.Tenant``)."""

    @property
    def log(self) -> ExperimentLog | None: ...

    @property
    def name(self) -> str: ...

    def replayed(self, batch: ResourceBatch, refused: Refusals, seq: int) -> None:
        """Merge one logged record again (and remember its digest); raises on a bug."""

    def failed(self, where: str, exc: BaseException) -> None:
        """Count a failure of this run (logged once)."""


R = TypeVar("R", bound=Replaying)


def replay(
    wal: WriteAheadLog, reopen: Callable[[dict[str, Any], int, float], R], note: Callable[[str], None]
) -> tuple[list[R], list[R]]:
    """Every run in ``wal`` reopened (``reopen(meta, attempt, last seen)``) and the records its views
    had not written merged again; returns (the runs that had any, the quiet ones: their logs still
    open, for the caller to close)."""
    back: list[R] = []
    quiet: list[R] = []
    for meta, attempt, seen in wal.found():
        run = reopen(meta, attempt, seen)
        run_log = run.log
        assert run_log is not None
        records = 0
        refused = Refusals()
        for seq, _step, payload in run_log.replay():
            try:
                run.replayed(batch_of(str(meta["experiment"]), payload), refused, seq)
            except Exception as exc:
                run.failed(f"replaying record {seq}", exc)
            records += 1
        for set_aside in run_log.set_aside:
            note(set_aside)
        if refused.count:  # acknowledged once, so never silently: what the run's state refuses now
            note(f"replaying {run.name[:96]}: {refused.count} points refused ({refused.message})")
        if records:
            log.warning("rankscope sink: replayed %d records of %s", records, run.name[:96])
            back.append(run)
        else:
            quiet.append(run)
    return back, quiet


def batch_of(experiment_id: str, payload: bytes) -> ResourceBatch:
    """A logged record (``wal.encode_record``) as the checked batch it was."""
    digest, resource, states, markers, samples = decode_record(payload)
    batch = ResourceBatch(experiment_id, resource, digest=digest)
    batch.states = [StateRows(*rows) for rows in states]
    batch.markers = [Marker.of_record(m) for m in markers]
    batch.samples = [SampleRow(*row) for row in samples]
    return batch
