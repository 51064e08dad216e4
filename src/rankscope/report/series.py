"""The page's metric charts: per role and key the spread over steps, the keys with a global
value only, and the ``rankscope/*`` and ``straggler/*`` keys (the health and phase charts).

Bounded however many keys and steps a client sends: at most ``MAX_SERIES`` series (and
``MAX_META_SERIES`` meta ones; what is refused is counted once per name) of at most
``MAX_POINTS`` points, each series thinning its own points (``Series``).

What a reader sees first (``kind_of``): the user's own keys, in the order they first came (a
series is kept in a dict, so its place is its first step's, and a snapshot keeps it); the
seconds of traced phases (``{block}/{phase}/duration_avg_s`` and the rest) go to the Phases
section only, one chart per traced block; rankscope's own keys (``rl/*``, ``rankscope/*``, the
straggler detector's ``straggler/*``) are internals, folded. A series whose every point is the
same (``constant``) is a table row, not a chart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import names as attr
from ..metrics.catalog import key_kind
from .values import listed, mapping, number, strict, string, text

MAX_POINTS = 1000
MAX_SERIES = 500
MAX_META_SERIES = 200
MAX_NAMES = 100_000
"""Refused series names remembered (so each is counted once), process labels interned."""

META_PREFIXES = (attr.META_PREFIX, attr.STRAGGLER_PREFIX)
DERIVED_SUFFIXES = ("/argmax_rank", "/argmin_rank")
INTERNAL_PREFIXES = ("rl/", *META_PREFIXES)
"""rankscope's own keys: its RL helpers' counts, the sink's, and the detectors' (folded on a page)."""
DETECTOR_CHARTS = ("/over_others", "/late_s", "/waited_s_max")
"""Of the ``straggler/*`` keys, those a page charts: per traced phase, the late rank's time (net of
collective waits) over the others' mean, as a ratio and in seconds, and the longest collective wait
in it; per collective (``straggler/comm/{op}/``), the last arrival's lateness and the longest wait.
Not the ranks (``/late_rank``): a rank is not a quantity to chart."""
TOTAL_SUFFIXES = {"/total_duration_avg_s": "avg", "/total_duration_max_s": "max"}
PHASE_SUFFIXES = {"/duration_avg_s": "avg", "/duration_max_s": "max"}
"""The duration metrics ``trace`` records (``tracing.tracer``): a traced block's total and each phase's."""


def kind_of(key: str) -> str:
    """Where a key goes on a page: ``internal`` (``INTERNAL_PREFIXES``, and what instrumentors
    record: ``comm/*``, ``optimizer/*``..., as the console has it), ``duration`` (a traced phase's
    seconds: the Phases section) or ``metric`` (the user's own: first)."""
    if key.startswith(INTERNAL_PREFIXES) or key_kind(key) == "internal":
        return "internal"
    if key.endswith((*TOTAL_SUFFIXES, *PHASE_SUFFIXES)):
        return "duration"
    return "metric"


def meta_charted(key: str) -> bool:
    """Of the meta keys (``rankscope/*``, ``straggler/*``), those a page charts."""
    return key.startswith(attr.META_PREFIX) or key.endswith(DETECTOR_CHARTS)


def constant(points: list[list[Any]]) -> bool:
    """Every point holds the same global value, median, min and max: a table row, not a chart."""
    return bool(points) and all(p[1:] == points[0][1:] for p in points)


@dataclass
class Series:
    """One role's key over steps: ``[step, global, median, min, max]`` points, holders apart."""

    points: list[list[Any]] = field(default_factory=list)
    holders: list[list[Any]] = field(default_factory=list)
    """``[min's label, max's label]`` per point."""
    last: list[Any] | None = None
    last_holders: list[Any] | None = None
    seen: int = 0
    stride: int = 1
    """Every ``stride``-th point this series got is kept (its own: a sparse series keeps its points)."""

    def drop_from(self, step: int) -> None:
        """Forget the points of ``step`` and later (a rewind: they come again)."""
        kept = [i for i, point in enumerate(self.points) if point[0] < step]
        self.points = [self.points[i] for i in kept]
        self.holders = [self.holders[i] for i in kept]
        if self.last is not None and self.last[0] >= step:
            self.last = self.points[-1] if self.points else None
            self.last_holders = self.holders[-1] if self.holders else None

    def add(self, point: list[Any], holders: list[Any]) -> None:
        self.last, self.last_holders = point, holders
        if self.seen % self.stride == 0:
            self.points.append(point)
            self.holders.append(holders)
            if len(self.points) > MAX_POINTS:
                self.stride *= 2
                self.points, self.holders = self.points[::2], self.holders[::2]
        self.seen += 1

    def state(self) -> list[Any]:
        return [self.points, self.holders, self.last, self.last_holders, self.seen, self.stride]

    def joined(self, other: Series) -> Series:
        """This series with ``other``'s points of steps it lacks (a copy): a role's key and its
        global-only points of steps viewed without a spread."""
        mine = {point[0] for point in self.points}
        pairs = sorted(
            [*zip(self.points, self.holders, strict=True)]
            + [(p, h) for p, h in zip(other.points, other.holders, strict=True) if p[0] not in mine],
            key=lambda pair: pair[0][0],
        )
        lasts = [(p, h) for p, h in ((self.last, self.last_holders), (other.last, other.last_holders)) if p is not None]
        last, last_holders = max(lasts, key=lambda pair: pair[0][0]) if lasts else (None, None)
        return Series([p for p, _ in pairs], [h for _, h in pairs], last, last_holders, self.seen, self.stride)

    def data(self, key: str) -> dict[str, Any]:
        """The chart: the kept points and the last one (always drawn)."""
        points, holders = list(self.points), list(self.holders)
        if self.last is not None and (not points or points[-1][0] != self.last[0]):
            points.append(self.last)
            holders.append(self.last_holders or [None, None])
        return {"key": key, "points": points, "holders": holders, "constant": constant(points)}


class MetricSeries:
    """The metric charts (module docstring), from the ``step`` events' values and spreads."""

    def __init__(self) -> None:
        self.processes: dict[str, int] = {}
        """Role → how many processes reported the largest step."""
        self.by_role: dict[tuple[str, str], Series] = {}
        self.globals: dict[str, Series] = {}
        """Keys with no process values (merged upstream, or past the view's spread limit): global only."""
        self.meta: dict[str, Series] = {}
        """``rankscope/*`` and ``straggler/*`` keys: the health and phase sections."""
        self.not_shown = 0
        self._refused: set[Any] = set()
        self._labels: dict[str, str] = {}
        self._order: dict[str, int] = {}
        """Each charted key's place: the order keys first came in, by role or global only (``joined``)."""

    def step(self, step: int, values: dict[str, Any], spread: dict[str, dict[str, list[Any]]]) -> None:
        """A step's points: a role's key where it has a spread, else global only. New series come in
        the global values' order (the sink's key order), not the spread's: that one is its first
        process's, and a key the lowest rank lacks this step would come after the others'."""
        for role, keys in spread.items():
            self.processes[text(role)] = max((int(c[5]) for c in keys.values()), default=0)
        for key, value in values.items():
            if key.startswith(META_PREFIXES):
                if not key.endswith(DERIVED_SUFFIXES):
                    self._point(self.meta, key, step, value, None)
                continue
            held = [(role, keys[key]) for role, keys in spread.items() if key in keys]
            for role, cell in held:
                self._point(self.by_role, (text(role), text(key)), step, value, cell)
            if not held and not key.endswith(DERIVED_SUFFIXES):
                self._point(self.globals, text(key), step, value, None)

    def late(self, step: int, values: dict[str, Any]) -> None:
        """A late update rewrites the step's global values where a point for it is kept."""
        named = [(role_key[1], s) for role_key, s in self.by_role.items()] + list(self.globals.items())
        for key, series in named:
            if key not in values:
                continue
            for point in (p for p in series.points if p[0] == step):
                point[1] = number(values[key])
            if series.last is not None and series.last[0] == step:
                series.last[1] = number(values[key])

    def drop_from(self, step: int) -> None:
        for table in (self.by_role, self.globals, self.meta):
            for series in table.values():
                series.drop_from(step)

    def _point(self, table: dict[Any, Series], name: Any, step: int, value: Any, cell: list[Any] | None) -> None:
        series = table.get(name)
        if series is None:
            full = len(self.meta) >= MAX_META_SERIES if table is self.meta else self._charts() >= MAX_SERIES
            if full:
                if len(self._refused) < MAX_NAMES and name not in self._refused:
                    self._refused.add(name)
                    self.not_shown += 1
                return
            series = table[name] = Series()
            if table is not self.meta:
                self._order.setdefault(name[1] if type(name) is tuple else name, len(self._order))
        low, low_by, high, high_by, median = cell[:5] if cell else (None, None, None, None, None)
        point = [step, number(value), number(median), number(low), number(high)]
        series.add(point, [self._label(low_by), self._label(high_by)])

    def _label(self, label: Any) -> str | None:
        """One copy of each process label, however many points name it."""
        if not label:
            return None
        found = text(label)
        return self._labels.setdefault(found, found) if len(self._labels) < MAX_NAMES else found

    def state(self) -> dict[str, Any]:
        """This part of a ``snapshot`` event."""
        return {
            "processes": self.processes,
            "series": [[role, key, s.state()] for (role, key), s in self.by_role.items()],
            "globals": [[key, s.state()] for key, s in self.globals.items()],
            "meta": [[key, s.state()] for key, s in self.meta.items()],
            "series_not_shown": self.not_shown,
            "refused": [list(name) if isinstance(name, tuple) else name for name in self._refused],
            "order": list(self._order),
        }

    @classmethod
    def restore(cls, event: dict[str, Any]) -> MetricSeries:
        """The part a snapshot holds, checked (``ValueError``: malformed)."""
        new = cls()
        new.processes = {string(role): strict(n) for role, n in mapping(event["processes"]).items()}
        new.by_role = {
            (string(role), string(key)): new._series_of(state)
            for role, key, state in listed(event["series"], MAX_SERIES)
        }
        new.globals = {string(key): new._series_of(state) for key, state in listed(event["globals"], MAX_SERIES)}
        if new._charts() > MAX_SERIES:  # a global-only series a role's joins is no chart of its own
            raise ValueError("series")
        new.meta = {string(key): new._series_of(state) for key, state in listed(event["meta"], MAX_META_SERIES)}
        new.not_shown = strict(event["series_not_shown"])
        new._refused = {
            (string(n[0]), string(n[1])) if isinstance(n, list) and len(n) == 2 else string(n)
            for n in listed(event["refused"], MAX_NAMES)
        }
        # then the tables' own order (all of it, in a snapshot of an older rankscope); a key of no
        # table is dropped: it could only grow the next snapshot's order past its bound
        charted = dict.fromkeys([key for _, key in new.by_role] + list(new.globals))
        for key in [*listed(event.get("order", []), 2 * MAX_SERIES), *charted]:
            if string(key) in charted:
                new._order.setdefault(key, len(new._order))
        return new

    def _series_of(self, state: Any) -> Series:
        points, holders, last, last_holders, seen, stride = state
        if len(listed(points, MAX_POINTS)) != len(listed(holders, MAX_POINTS)):
            raise ValueError("series")
        return Series(
            [_point(p) for p in points],
            [self._holders(h) for h in holders],
            None if last is None else _point(last),
            None if last_holders is None else self._holders(last_holders),
            strict(seen),
            strict(stride, 1),
        )

    def _holders(self, holders: Any) -> list[Any]:
        low, high = holders
        return [self._label(low), self._label(high)]

    def roles(self) -> list[str]:
        """The roles with a spread, in a page's order: the most processes first, then by name."""
        return sorted({role for role, _ in self.by_role}, key=lambda role: (-self.processes.get(role, 0), role))

    def data(self) -> dict[str, Any]:
        """This part of the page's data, in the order a reader wants it (module docstring): the
        user's keys by role (the role with the most processes first) and global only, each in
        the order it first came; the phase charts; the internals."""
        user: dict[str, list[dict[str, Any]]] = {role: [] for role, _ in self.by_role}
        user_globals: list[dict[str, Any]] = []
        durations: list[dict[str, Any]] = []
        internals: list[dict[str, Any]] = []
        by_role, user_global = self.joined()
        named = [(role, key, s) for (role, key), s in by_role.items()]
        named += [("", key, s) for key, s in user_global.items()]
        for role, key, series in named:
            kind = kind_of(key)
            if kind == "metric":
                (user[role] if role else user_globals).append(series.data(key))
            else:
                (durations if kind == "duration" else internals).append({"role": role, **series.data(key)})
        for key, series in self.meta.items():
            if meta_charted(key):
                internals.append({"role": "", **series.data(key)})
        roles = self.roles()
        return {
            "stride": max((s.stride for t in (self.by_role, self.globals) for s in t.values()), default=1),
            "roles": [{"role": role, "processes": self.processes.get(role, 0), "keys": user[role]} for role in roles],
            "globals": user_globals,
            "phase_charts": sorted(phase_charts(durations), key=lambda c: _place(roles, c["role"])),
            "internals": internals,
            "series_not_shown": self.not_shown,
        }

    def _charts(self) -> int:
        """Series that are charts of their own: a global-only one a role's joins (``joined``) is not."""
        shared = self.globals.keys() & {key for _, key in self.by_role} if self.globals else ()
        return len(self.by_role) + len(self.globals) - len(shared)

    def joined(self) -> tuple[dict[tuple[str, str], Series], dict[str, Series]]:
        """The series by role and global only, a global-only series of a key that one role's
        series has too joined into that one: a step viewed without its spread (a run's first step
        after time buckets, ``sink.book.buckets``; a step past the spread limit) is not a chart
        of its own. Keys come in the order they first came, in either table: a phase whose first
        step came without its spread keeps its place before the phases after it."""
        roles: dict[str, list[str]] = {}
        for role, key in self.by_role:
            roles.setdefault(key, []).append(role)
        last = len(self._order)
        by_role = dict(sorted(self.by_role.items(), key=lambda item: self._order.get(item[0][1], last)))
        alone: dict[str, Series] = {}
        for key, series in self.globals.items():
            found = roles.get(key, ())
            if len(found) == 1:
                by_role[(found[0], key)] = by_role[(found[0], key)].joined(series)
            else:
                alone[key] = series
        return by_role, alone


def phase_charts(durations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The duration series as one chart per (role, traced block): a line per phase (its total
    last), each point ``[step, mean seconds, max seconds]`` over the role's processes."""
    totals = {d["key"][: -len(suffix)] for d in durations for suffix in TOTAL_SUFFIXES if d["key"].endswith(suffix)}
    charts: dict[tuple[str, str], dict[str, dict[int, list[Any]]]] = {}
    for series in durations:
        key = series["key"]
        block, phase, stat = _phase_of(key, totals)
        lines = charts.setdefault((series["role"], block), {})
        by_step = lines.setdefault(phase, {})
        column = 1 if stat == "avg" else 2
        for point in series["points"]:
            by_step.setdefault(point[0], [point[0], None, None])[column] = point[1]
    out = []
    for (role, block), lines in charts.items():
        phases = sorted(lines, key=lambda phase: phase == "total")  # stable: the total last
        out.append(
            {
                "role": role,
                "block": block,
                "lines": [{"phase": phase, "points": sorted(lines[phase].values())} for phase in phases],
            }
        )
    return out


def _place(roles: list[str], role: str) -> int:
    return roles.index(role) if role in roles else len(roles)


def _phase_of(key: str, totals: set[str]) -> tuple[str, str, str]:
    """(traced block, phase, ``avg``/``max``) of a duration key; the block is the longest one
    whose total came too (a phase name may hold a ``/``), else all but the last part."""
    for suffix, stat in TOTAL_SUFFIXES.items():
        if key.endswith(suffix):
            return key[: -len(suffix)], "total", stat
    for suffix, stat in PHASE_SUFFIXES.items():
        if key.endswith(suffix):
            rest = key[: -len(suffix)]
            known = [block for block in totals if rest.startswith(block + "/")]
            block = max(known, key=len) if known else rest.rpartition("/")[0]
            return block, rest[len(block) + 1 :] if block else rest, stat
    raise ValueError(key)


def _point(point: Any) -> list[Any]:
    """A series point from a snapshot: ``[step, global, median, min, max]``."""
    step, value, median, low, high = point
    return [strict(step), number(value), number(median), number(low), number(high)]
