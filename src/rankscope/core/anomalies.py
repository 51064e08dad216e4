"""Anomaly records: one frozen type per kind of thing a sink's detectors (or its captures) report.

A record is a type everywhere inside rankscope and a dict only where it leaves (a JSONL line, the
status route, a report event): ``to_json``. A view dispatches on the type (``match record:
case Straggler(): ...``), never on a string; what reads the serialized form back (the report,
``rankscope top``) compares ``"type"`` with a ``KIND`` named here, or parses it with
``from_json``. Adding a kind is a class here, the detector that makes it, and the views that
draw it.

Every record names its ``step`` (None: not a step's, e.g. a capture announced between steps)
and, where it is one process's, who (``process`` is its label; ``role``, ``replica``, ``rank``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

_OMIT_WHEN_EMPTY = {"omit": True}
"""Field metadata: left out of ``to_json`` while it holds its default (the wire shape before the
field existed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Anomaly:
    """What every record has: its kind (``KIND``, the serialized ``"type"``) and its step."""

    KIND: ClassVar[str] = ""
    step: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The record where it leaves rankscope: ``{"type": KIND, "step": ..., ...}``."""
        out: dict[str, Any] = {"type": self.KIND}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("omit") and value == f.default:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @property
    def streak(self) -> Hashable:
        """What makes two steps' records of this kind one streak (a view says a streak once)."""
        return (self.KIND,)


@dataclass(frozen=True, slots=True, kw_only=True)
class Located(Anomaly):
    """A record of one process (None: no process could be named)."""

    process: str | None = None
    role: str | None = None
    replica: str | None = None
    rank: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NonFinite(Located):
    """A step's merged value of ``key`` is NaN or infinite; the process that recorded it first."""

    KIND: ClassVar[str] = "nonfinite"
    key: str = ""
    count: int = 0
    """Process states of the step whose value was not finite."""
    keys: tuple[str, ...] = ()
    first: bool = dataclasses.field(default=False, metadata=_OMIT_WHEN_EMPTY)
    """The run's first non-finite value."""

    @property
    def streak(self) -> Hashable:
        return (self.KIND, self.key, self.process)


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler(Located):
    """One process held its steps up (``sink.book.stragglers``): one record per streak, with the
    latest step's figures and the streak's extent so far."""

    KIND: ClassVar[str] = "straggler"
    first_step: int = 0
    last_step: int = 0
    steps: int = 0
    """Judged steps in a row it was named."""
    phase: str = ""
    """The phase its time went to ("": it was late to a collective only)."""
    collective: str | None = None
    """The collective it arrived last at."""
    ratio: float = 0.0
    excess_s: float = 0.0
    seconds: float = 0.0
    others_s: float = 0.0
    late_s: float | None = None
    waited_s_max: float | None = None
    """The longest another process waited for it at the collective."""
    waiting: int | None = None
    rule: str = dataclasses.field(default="", metadata=_OMIT_WHEN_EMPTY)
    """What named it (``sink.book.stragglers``): ``arrival`` (last at a collective its spans
    show), ``shortest_sync`` (the others waited for it in ``sync_phase``, a collective no span
    shows) or ``phase`` (its phase time, net of the waits the spans show)."""
    sync_phase: str = dataclasses.field(default="", metadata=_OMIT_WHEN_EMPTY)
    """The phase the others waited for it in, by the shortest-sync rule."""
    capture: str | None = dataclasses.field(default=None, metadata=_OMIT_WHEN_EMPTY)
    """The profiler capture asked of its process, if any."""

    @property
    def streak(self) -> Hashable:
        return (self.KIND, self.process, self.first_step)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outlier(Located):
    """One process's value of a key far from the other processes' (``sink.book.outliers``): one
    record per streak, with the latest step's figures and the streak's extent so far."""

    KIND: ClassVar[str] = "outlier"
    key: str = ""
    value: float = 0.0
    """The process's own value (its mean, sum or standard deviation of the step)."""
    others_mean: float = 0.0
    others_std: float = 0.0
    """The other processes' mean and standard deviation (of the same role)."""
    sigmas: float = 0.0
    """(value - others_mean) / others_std, signed (a large number when the others agree exactly)."""
    others: int = 0
    first_step: int = 0
    last_step: int = 0
    steps: int = 0
    """Judged steps in a row it was named."""

    @property
    def streak(self) -> Hashable:
        return (self.KIND, self.process, self.key, self.first_step)


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowStep(Anomaly):
    """A step's wall-clock window far over the median of the last ones."""

    KIND: ClassVar[str] = "slow_step"
    seconds: float = 0.0
    median_s: float = 0.0
    factor: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Missing(Anomaly):
    """Processes a step waited for in vain (the first 64, and how many)."""

    KIND: ClassVar[str] = "missing"
    processes: tuple[str, ...] = ()
    count: int = 0

    @property
    def streak(self) -> Hashable:
        return (self.KIND, self.processes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Interrupted(Anomaly):
    """A step the job ended in (Ctrl-C, a crash): not judged; the processes that had not closed it."""

    KIND: ClassVar[str] = "interrupted"
    processes: tuple[str, ...] = ()
    count: int = 0
    failed: tuple[str, ...] = ()
    """The processes an exception ended: the job failed, not stopped."""
    errors: tuple[str, ...] = ()
    """Each failed process's exception (``Type: message``), in ``failed``'s order."""

    @property
    def streak(self) -> Hashable:
        return (self.KIND, self.step)


@dataclass(frozen=True, slots=True, kw_only=True)
class Corrected(Anomaly):
    """A finalized step's late update: the processes whose part arrived since (the first 64, and how
    many), merged with what came in time: the step's values are its exact total again, lacking only
    the ``missing`` processes still absent."""

    KIND: ClassVar[str] = "corrected"
    processes: tuple[str, ...] = ()
    count: int = 0
    missing: int = 0

    @property
    def streak(self) -> Hashable:
        return (self.KIND, self.processes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Partial(Anomaly):
    """Late data of a step whose states were no longer kept (``retain_seconds``, ``retain_bytes``):
    the step's values stay as written and lack these processes' ``points``."""

    KIND: ClassVar[str] = "partial"
    processes: tuple[str, ...] = ()
    count: int = 0
    points: int = 0

    @property
    def streak(self) -> Hashable:
        return (self.KIND, self.processes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Capture(Located):
    """A profiler trace a process uploaded: where it lies and why it was asked."""

    KIND: ClassVar[str] = "capture"
    capture: str = ""
    reason: str = ""
    steps: int | None = None
    path: str = ""
    bytes: int = 0

    @property
    def streak(self) -> Hashable:
        return (self.KIND, self.capture, self.process)


KINDS: dict[str, type[Anomaly]] = {
    k.KIND: k for k in (NonFinite, Straggler, Outlier, SlowStep, Missing, Interrupted, Corrected, Partial, Capture)
}
"""Every kind by its serialized ``"type"``."""


MAX_TEXT = 4096
"""Characters of one text field a record read back may hold."""
MAX_NAMES = 64
"""Names (processes, keys) one record read back may list."""


def from_json(data: Mapping[str, Any]) -> Anomaly | None:
    """A serialized record read back (the status route, a report's events): None when its type is
    unknown or a field does not fit its declared type and bounds. Unknown fields are ignored (a
    newer sink); a straggler record of an older sink (one step, no streak) is its own streak."""
    kind = KINDS.get(str(data.get("type")))
    if kind is None:
        return None
    hints = _hints(kind)
    values: dict[str, Any] = {}
    for name, hint in hints.items():
        if name not in data:
            continue
        value = data[name]
        if isinstance(value, list):
            value = tuple(value)
        if not _fits(value, hint):
            return None
        values[name] = value
    if kind is Straggler and isinstance(values.get("step"), int):
        values.setdefault("first_step", values["step"])
        values.setdefault("last_step", values["step"])
        values.setdefault("steps", 1)
    return kind(**values)


def _hints(kind: type[Anomaly]) -> dict[str, Any]:
    """A record type's fields and their declared types (resolved once per type)."""
    found = _HINTS.get(kind)
    if found is None:
        hints = typing.get_type_hints(kind)
        found = _HINTS[kind] = {f.name: hints[f.name] for f in dataclasses.fields(kind)}
    return found


_HINTS: dict[type[Anomaly], dict[str, Any]] = {}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a read-back value is of its field's declared type, within the bounds."""
    if isinstance(hint, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str) and len(value) <= MAX_TEXT
    if typing.get_origin(hint) is tuple:
        return (
            isinstance(value, tuple)
            and len(value) <= MAX_NAMES
            and all(isinstance(v, str) and len(v) <= MAX_TEXT for v in value)
        )
    return False
