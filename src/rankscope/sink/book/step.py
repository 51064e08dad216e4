"""One step of the book: what it holds from its first data until its view (and its late updates).

Each key is one running state (``merge``): what arrives is merged at once, and nothing is kept
per point past the step's view except the rows a view may ask per-process values of.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..checked import Process, StateRows
from .merge import Running
from .tables import SampleTable


@dataclass(slots=True)
class Step:
    step: int
    opened: float
    merged: dict[str, Running] = field(default_factory=dict)
    """Each key's running state (``sink.book.merge``): the global view reduces these."""
    parts: list[tuple[Process, StateRows]] = field(default_factory=list)
    """The rows taken since the step's last view, by process: per-process values on demand."""
    viewed: set[str] = field(default_factory=set)
    """Processes (by id) whose rows went into a view of this step already."""
    expected: int = 0
    driven: bool = False
    reporters: set[str] = field(default_factory=set)
    """Processes (by id) that closed the step (their flush markers)."""
    sent: set[str] = field(default_factory=set)
    """Processes (by id) whose own data the step holds: one that said goodbye is missing from a step
    it sent part of (cut short), not from one it never began (``roster``)."""
    from_merge: bool = False
    """A Collector's merge sent part of it: its ranks' markers come after, as rank sets (``readiness``)."""
    seq: int = 0
    """Newest write-ahead-log record merged into this step (what a written view covers)."""
    late_points: int = 0
    missing: list[str] = field(default_factory=list)
    """Processes the step was finalized without and that have not sent it since, by label."""
    arrived: list[str] = field(default_factory=list)
    """Processes whose part came late since the step's last view, by label (its next late update names them)."""
    finalized: float = 0.0
    """When the step was first finalized (its late data is kept for ``retain_seconds`` from then)."""
    tables: bool = True
    """False: a step read back packed (``book.retained``), its sample tables not kept: late sample
    rows are refused, never written as the step's selection."""
    whole: bool = True
    """False: late data of a step no longer kept, alone (``book.retained``): a partial value, never
    written as the step's."""
    samples: dict[str, SampleTable] = field(default_factory=dict)
    """Sample tables (``record_sample``): every process's rows merged into one selection each."""
    carried: dict[int, int] = field(default_factory=dict)
    """The time buckets this step took over or dropped (``book.buckets``), each with its newest
    write-ahead-log record: the step's view covers their records too."""

    def hand_over(self) -> list[tuple[Process, StateRows]]:
        """The rows taken since the step's last view, for the next one (its rows start a new list).
        A process already in a view of the step is left out: it would get a partial value (one that
        sent part of the step in time keeps its in-time value; one whose part came in a time bucket
        viewed before the run stepped has its value in that view, ``book.buckets``)."""
        parts, self.parts = self.parts, []
        senders = {process.id for process, _ in parts}
        if self.viewed:
            parts = [(process, rows) for process, rows in parts if process.id not in self.viewed]
        self.viewed |= senders
        return parts
