"""Who held a step up: the rank that arrived last at each collective, and every traced phase net of
the waits inside it. The cause, never its victims.

A rank slow in its forward pass makes every other rank wait in the next all-reduce; judged by
phase time alone, the waiters' backward looks as slow as the culprit's forward (with two ranks,
both are "2x the median"). So, from one step's spans (of the run's latest attempt in them):

* **Collectives.** Each process's ``comm/{op}`` spans (``tracing.collectives``) in the
  order it made them, per torch world (role, replica, attempt) and process group
  (``rankscope.comm.group``): the k-th of a group on every member is one collective, judged
  only when every member's span is in (``rankscope.comm.group_size``). A blocking collective
  releases its members together, so its end is a moment they share: a rank's arrival is its end
  minus its duration, the last to arrive is the one that spent least time in it, and each other
  rank waited its duration minus that. Host clocks need not agree. (An async collective counts
  from launch to completion: its wait is an upper bound.) Point-to-point calls (``send``,
  ``recv``) are no collective: a pipeline's stages wait for each other by design; their time
  counts as waiting. The matched spans get ``rankscope.comm.wait_s`` and, on the last to
  arrive, ``rankscope.comm.arrived_last`` (the report's Gantt marks it): the one thing judging
  writes, onto the sink's own copy of the spans.
* **Phases.** Each process's time in each traced phase, net of its waits that overlap the phase
  in time on its own clock (a phase's span is made when the phase closes, so the SDK parents a
  collective to the block around it; an async wait may straddle two phases; a collective that
  matched nothing counts whole), against the mean of the role's other processes that traced
  it: right with two ranks (the other one) and with 10,000.
* **Waits no span shows.** A collective run where Python never sees it (NCCL from C++, a
  framework's own reducer, a job with the collectives' wrappers off) leaves its wait inside a
  phase: the ranks that waited for a late one spend longer in the phase that holds the
  collective, and leave it with the late one. Such a phase's furthest process is dismissed as
  a waiter (the shortest-sync rule) when the process that spent *least* in that phase (it
  arrived last, so it waited least) left it at the same moment as the furthest and as most
  processes (within a quarter of the gap between their times in it: a release they shared),
  most of the others spent at least half that gap longer in it than it did (they waited), and
  it is over the others in another phase by at least half that gap: the excess that made the
  others wait. Where a
  waiter so dismissed would have been named, the late process is named by the rule
  ``shortest_sync``, with the phase the others waited in (``sync_phase``). This compares two
  hosts' clocks: hosts whose clocks disagree by more than a quarter of the gap (not NTP-synced)
  dismiss no one, and both are named, as without the rule.
* **Causes.** The process furthest over the others in a phase, and the last to arrive at a
  collective, with how much its time to get there (since its previous collective, or its step's
  start) exceeds the others'. ``stragglers`` keeps those over the detectors' thresholds.

Linear in the step's spans: nothing compares ranks pairwise, a process's open phases at a wait
are at most ``MAX_OPEN_PHASES``, a role's phase names at most ``MAX_NAMED`` (the rest are not
judged): a client's spans cannot make the shared finalizer quadratic.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from statistics import median_low
from typing import Any

from ...backends.base import Metric
from ...core import names as attr
from ...core.anomalies import Straggler
from ...metrics.reduce import Reduce
from ..checked import Process
from .traces import ROOT_NAME, StoredSpan

COMM_PREFIX = "comm/"
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv"})
OP = re.compile(r"[a-z][a-z0-9_]{0,39}")
"""An op name judged (``all_reduce``): a client's other values are not matched, nor become keys."""
MAX_NAMED = 64
"""Phase names per role judged, and phases and collective ops a step's keys name, at most."""
MAX_OPEN_PHASES = 64
"""Phases of one process open at one wait that it is subtracted from (deeper nesting is not judged)."""

SHARED_RELEASE = 0.25
"""Two processes left a phase together when their ends differ by at most this share of the gap
between their times in it (the shortest-sync rule)."""

SAME_LATENESS = 0.8
"""A process as late at a collective as at its latest when its lateness is this share of it."""

World = tuple[str, str | None, int]
"""A torch world: (role, replica, attempt), ``checked.Process.group``."""


@dataclass(frozen=True, slots=True)
class Lateness:
    """One candidate cause: ``process`` took ``seconds`` where the others took ``others_s`` on
    average; for a collective, it arrived ``late_s`` after the others' mean arrival and the first
    to arrive waited ``waited_s_max`` for it, ``waiting`` ranks in all."""

    process: Process
    phase: str
    seconds: float
    others_s: float
    collective: str | None = None
    late_s: float | None = None
    waited_s_max: float | None = None
    waiting: int = 0
    sync_phase: str = ""
    """The phase the others waited for it in, where no collective span shows the wait
    (the shortest-sync rule); "" otherwise."""

    @property
    def rule(self) -> str:
        """What named it: ``arrival`` (last at a collective its spans show), ``shortest_sync``
        (the others' wait in ``sync_phase``, a collective no span shows) or ``phase`` (its phase
        time net of the waits the spans show)."""
        if self.collective is not None:
            return "arrival"
        return "shortest_sync" if self.sync_phase else "phase"

    @property
    def excess_s(self) -> float:
        return self.late_s if self.late_s is not None else self.seconds - self.others_s

    @property
    def ratio(self) -> float:
        """Its time over the others' (a large number when theirs is 0)."""
        if self.others_s > 0:
            return self.seconds / self.others_s
        return 1.0 if self.seconds <= 0 else 1e9


@dataclass(slots=True)
class PhaseTimes:
    """Net seconds per process of one phase of one role; its furthest process and the others' mean."""

    name: str
    seconds: dict[Any, float] = field(default_factory=dict)
    waited: dict[Any, float] = field(default_factory=dict)
    """Seconds each process waited in collectives during the phase."""
    ends: dict[Any, int] = field(default_factory=dict)
    """When each process last left the phase (ns, its own clock)."""
    total: float = 0.0

    def add(self, process: Process, net: float, waited: float, end_ns: int) -> None:
        self.seconds[process] = self.seconds.get(process, 0.0) + net
        self.total += net
        if end_ns > self.ends.get(process, end_ns - 1):
            self.ends[process] = end_ns
        if waited:
            self.waited[process] = self.waited.get(process, 0.0) + waited

    def others_mean(self, process: Process) -> float:
        n = len(self.seconds)
        return (self.total - self.seconds[process]) / (n - 1) if n > 1 else 0.0

    def furthest(self) -> Lateness | None:
        if len(self.seconds) < 2:
            return None
        process, seconds = max(self.seconds.items(), key=lambda kv: kv[1])
        return Lateness(process, self.name, seconds, self.others_mean(process))


@dataclass(slots=True)
class Judgement:
    """One step's phases (net of waits) and collectives, and the candidate causes in them."""

    phases: dict[tuple[str, str], PhaseTimes] = field(default_factory=dict)
    """Per (role, phase name)."""
    collectives: dict[str, Lateness] = field(default_factory=dict)
    """Per op (``all_reduce``): its collective of the step with the latest last arrival."""
    causes: list[Lateness] = field(default_factory=list)
    """Per phase its furthest process; per op, each process that arrived last at one of its
    collectives, at the latest of them (named by the phase where its time went)."""
    waiters: dict[tuple[str, str], Lateness] = field(default_factory=dict)
    """Per (role, phase): its furthest process, dismissed as waiting there for another (the
    shortest-sync rule); its excess is a wait."""
    waited_for: dict[Any, list[Lateness]] = field(default_factory=dict)
    """Per process: the waiters dismissed as waiting for it (the shortest-sync rule)."""


def judge(spans: Iterable[StoredSpan]) -> Judgement:
    """The step's judgement from its spans (see the module docstring). Sets the matched
    collectives' ``rankscope.comm.wait_s`` and ``rankscope.comm.arrived_last``."""
    kept = [s for s in spans if s.end_ns >= s.start_ns]
    attempt = max((s.process.attempt for s in kept), default=0)
    comms: dict[Any, list[StoredSpan]] = defaultdict(list)
    phases: list[StoredSpan] = []
    began: dict[Any, int] = {}
    for span in kept:
        process = span.process
        if process.attempt != attempt:  # a step run again: the earlier attempt's spans are not judged
            continue
        if process not in began or span.start_ns < began[process]:
            began[process] = span.start_ns
        if span.name.startswith(COMM_PREFIX):
            span.attributes.pop(attr.COMM_LAST, None)  # the sink's to say, not a client's
            span.attributes.pop(attr.COMM_WAIT, None)
            if isinstance(span.attributes.get(attr.COMM_OP), str):
                comms[process].append(span)
        elif not (span.name == ROOT_NAME and not span.parent_span_id):
            phases.append(span)
    judgement = Judgement()
    waits = _collectives(comms, began, judgement)
    _net_phases(phases, _waited_in(comms, phases, waits), judgement)
    for times in judgement.phases.values():
        furthest = times.furthest()
        if furthest is not None:
            judgement.causes.append(furthest)
    _dismiss_waiters(judgement)
    judgement.causes = [c if c.collective is None else _with_phase(c, judgement.phases) for c in judgement.causes]
    return judgement


def _dismiss_waiters(judgement: Judgement) -> None:
    """The shortest-sync rule (the module docstring): a phase's furthest process is a waiter when
    the process that spent least in the phase left it with the furthest and most processes (a
    release they shared), most others spent far longer in it (they waited) and it is over the
    others elsewhere by at least half the gap. Each cause looks at its own role's phases only."""
    by_role: dict[str, list[tuple[str, PhaseTimes]]] = defaultdict(list)
    for (role, name), times in judgement.phases.items():
        if len(times.seconds) > 1:
            by_role[role].append((name, times))
    for cause in judgement.causes:
        if cause.collective is not None:
            continue
        role, name = cause.process.role, cause.phase
        times = judgement.phases[(role, name)]
        least, shortest = min(times.seconds.items(), key=lambda kv: kv[1])
        gap = cause.seconds - shortest
        if least == cause.process or gap <= 0:
            continue
        left = times.ends[least]
        together = SHARED_RELEASE * gap * 1e9
        if abs(left - times.ends[cause.process]) > together or abs(left - median_low(times.ends.values())) > together:
            continue  # they did not leave it together: no collective released them
        if median_low(v for p, v in times.seconds.items() if p != least) < shortest + 0.5 * gap:
            continue  # most of the others were as quick as the least: nobody waited for it there
        elsewhere = max(
            (
                mine.seconds[least] - mine.others_mean(least)
                for other, mine in by_role[role]
                if least in mine.seconds and not _nested(name, other)
            ),
            default=0.0,
        )
        if elsewhere >= 0.5 * gap:
            judgement.waiters[(role, name)] = cause
            judgement.waited_for.setdefault(least, []).append(cause)
    judgement.causes = [
        c for c in judgement.causes if c.collective is not None or (c.process.role, c.phase) not in judgement.waiters
    ]


def _nested(a: str, b: str) -> bool:
    """Whether phase ``a`` holds ``b``, ``b`` holds ``a``, or they are one (``train``, ``train/forward``)."""
    return a == b or b.startswith(a + "/") or a.startswith(b + "/")


def _waited_in(
    comms: Mapping[Any, list[StoredSpan]], phases: list[StoredSpan], waits: Mapping[int, float]
) -> dict[int, float]:
    """Per phase span (by ``id``): seconds of its process's collective waits that overlap it. A
    wait is ``[start, start + wait]``: a rank that waited arrived first, waited for the last, then
    spent the collective's own time (the transfer, the last one's whole time in it) with the
    others. That time stays in every rank's phase alike: netted from the waiters' only, a late
    rank's backward looked 40-60 ms over theirs on a busy box. A collective that matched nothing
    counts whole. Waits overlapping in time count once (the union
    of their windows). An async wait starts no earlier than the process's latest launch by its end
    (until then the process went on: it launched more); a DDP bucket's (``rankscope.comm.source``
    "ddp") no earlier than the process's last bucket launch of the step: DDP blocks only at the end
    of backward, and a rank computing its later buckets is not waiting for the earlier ones. One
    sweep per process (its collectives sorted by launch)."""
    by_process: dict[Any, list[StoredSpan]] = defaultdict(list)
    for span in phases:
        by_process[span.process].append(span)
    waited_in: dict[int, float] = defaultdict(float)
    for process, made in comms.items():
        launches = [comm.start_ns for comm in made]
        buckets = max((c.start_ns for c in made if c.attributes.get(attr.COMM_SOURCE) == "ddp"), default=0)
        windows = _union(
            (
                max(
                    comm.start_ns,
                    launches[bisect_right(launches, high) - 1],  # its latest launch by then
                    buckets if comm.attributes.get(attr.COMM_SOURCE) == "ddp" else 0,
                ),
                high,
            )
            for comm in made
            for high in (_waited_until(comm, waits),)
        )
        mine = sorted(by_process.get(process, ()), key=lambda s: s.start_ns)
        open_: list[StoredSpan] = []
        i = 0
        for low, high in windows:
            while i < len(mine) and mine[i].start_ns < high:
                open_.append(mine[i])
                i += 1
            open_ = [s for s in open_ if s.end_ns > low][-MAX_OPEN_PHASES:]
            for span in open_:
                overlap = min(span.end_ns, high) - max(span.start_ns, low)
                if overlap > 0:
                    waited_in[id(span)] += overlap / 1e9
    return waited_in


def _waited_until(comm: StoredSpan, waits: Mapping[int, float]) -> int:
    """When ``comm``'s process stopped waiting in it: its wait after its launch (the whole span when
    it matched nothing)."""
    wait = waits.get(id(comm))
    return comm.end_ns if wait is None else min(comm.end_ns, comm.start_ns + int(wait * 1e9))


def _union(windows: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sorted, disjoint union of ``[low, high)`` windows (empty ones dropped)."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(w for w in windows if w[1] > w[0]):
        if out and low <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def _net_phases(phases: list[StoredSpan], waited_in: Mapping[int, float], judgement: Judgement) -> None:
    names: dict[str, int] = defaultdict(int)
    for span in phases:
        role = span.process.role
        times = judgement.phases.get((role, span.name))
        if times is None:
            if names[role] >= MAX_NAMED:
                continue
            names[role] += 1
            times = judgement.phases[(role, span.name)] = PhaseTimes(span.name)
        waited = waited_in.get(id(span), 0.0)
        times.add(span.process, max(0.0, (span.end_ns - span.start_ns) / 1e9 - waited), waited, span.end_ns)


def _collectives(
    comms: Mapping[Any, list[StoredSpan]], began: Mapping[Any, int], judgement: Judgement
) -> dict[int, float]:
    """Match the collectives, mark their spans, keep each op's latest; returns each matched span's wait."""
    matched: dict[tuple[World, str, int, str], list[tuple[Any, StoredSpan, float]]] = defaultdict(list)
    for process, made in comms.items():
        made.sort(key=lambda s: s.start_ns)
        index: dict[str, int] = defaultdict(int)
        previous_end = began.get(process, made[0].start_ns)
        for span in made:
            op = span.attributes[attr.COMM_OP]
            if op in POINT_TO_POINT or not OP.fullmatch(op):
                continue
            group = str(span.attributes.get(attr.COMM_GROUP) or span.attributes.get(attr.COMM_GROUP_SIZE, ""))
            k = index[group]
            index[group] = k + 1
            to_arrive = max(0, span.start_ns - previous_end) / 1e9
            matched[(process.group, group, k, op)].append((process, span, to_arrive))
            previous_end = max(previous_end, span.end_ns)
    waits: dict[int, float] = {}
    last_at: dict[tuple[int, str], list[tuple[int, Lateness]]] = defaultdict(list)
    """Per (process, op): (when it arrived, its lateness) at each collective it was the last at."""
    for (_, _, _, op), members in matched.items():
        size = members[0][1].attributes.get(attr.COMM_GROUP_SIZE)
        if len(members) < 2 or (isinstance(size, int) and len(members) < size):
            continue  # a member's span is missing (dropped, late): who was last is not known
        late = _arrivals(op, members, waits)
        if late is None:
            continue
        kept = judgement.collectives.get(op)
        if kept is None or late.excess_s > kept.excess_s:
            judgement.collectives[op] = late
        arrived = next(s.start_ns for p, s, _ in members if p is late.process)
        last_at[(id(late.process), op)].append((arrived, late))
    judgement.causes.extend(_first_behind(found) for found in last_at.values())
    return waits


def _first_behind(found: list[tuple[int, Lateness]]) -> Lateness:
    """Of the collectives a process was last at, the first where it was about as late as at the
    latest (within ``SAME_LATENESS``): where it fell behind. DDP's bucket all-reduces are in flight
    together, and a rank late at the first is as late at the rest, which it reached straight
    from the one before (no time of its own to get there)."""
    most = max(late.excess_s for _, late in found)
    return min((f for f in found if f[1].excess_s >= SAME_LATENESS * most), key=lambda f: f[0])[1]


def _arrivals(op: str, members: list[tuple[Any, StoredSpan, float]], waits: dict[int, float]) -> Lateness | None:
    """One collective: each member's wait (into ``waits``, onto its span) and the last to arrive,
    or None when nobody waited (no one was last)."""
    durations = [(s.end_ns - s.start_ns) / 1e9 for _, s, _ in members]
    last = min(range(len(members)), key=durations.__getitem__)
    shortest = durations[last]
    if max(durations) <= shortest:
        return None
    total_wait, waiting = 0.0, 0
    for i, (_, span, _) in enumerate(members):
        wait = durations[i] - shortest
        waits[id(span)] = wait
        span.attributes[attr.COMM_WAIT] = round(wait, 9)
        total_wait += wait
        waiting += wait > 0
    process, span, to_arrive = members[last]
    span.attributes[attr.COMM_LAST] = True
    n = len(members)
    return Lateness(
        process,
        "",
        to_arrive,
        (sum(t for _, _, t in members) - to_arrive) / (n - 1),
        collective=op,
        late_s=total_wait / (n - 1),  # its arrival after the others' mean arrival
        waited_s_max=max(durations) - shortest,
        waiting=waiting,
    )


def _with_phase(late: Lateness, phases: Mapping[tuple[str, str], PhaseTimes]) -> Lateness:
    """``late`` named by the phase where its process's time most exceeds the others' (net)."""
    role = late.process.role
    over = {
        name: times.seconds[late.process] - times.others_mean(late.process)
        for (of, name), times in phases.items()
        if of == role and late.process in times.seconds and len(times.seconds) > 1
    }
    return replace(late, phase=deepest(over))


def deepest(excess: Mapping[str, float]) -> str:
    """The phase of the largest positive excess, or a phase inside it that holds most of it
    (``train/forward`` rather than ``train`` when forward is where the time went); "" if none."""
    positive = {name: over for name, over in excess.items() if over > 0}
    if not positive:
        return ""
    best = max(positive, key=positive.__getitem__)
    while True:
        inside = [n for n in positive if n.startswith(best + "/") and positive[n] >= 0.8 * positive[best]]
        if not inside:
            return best
        best = max(inside, key=positive.__getitem__)


def stragglers(judgement: Judgement, *, ratio: float, min_s: float) -> list[Lateness]:
    """The causes over both thresholds (``ratio`` times the others', ``min_s`` seconds more),
    one per process: named by the phase inside which most of its excess lies, with the collective
    it arrived latest at, if it was the last at one."""
    over: dict[Any, list[Lateness]] = defaultdict(list)
    for cause in judgement.causes:
        if _over(cause, ratio, min_s):
            over[cause.process].append(cause)
    out: list[Lateness] = []
    for found in over.values():
        phased = {c.phase: c for c in found if c.collective is None}
        arrived = [c for c in found if c.collective is not None]
        collective = max(arrived, key=lambda c: c.late_s or 0.0) if arrived else None
        name = deepest({n: c.excess_s for n, c in phased.items()})
        if not name:
            out.append(collective if collective is not None else max(found, key=lambda c: c.excess_s))
            continue
        chosen = phased[name]
        if collective is not None:
            chosen = replace(
                chosen,
                collective=collective.collective,
                late_s=collective.late_s,
                waited_s_max=collective.waited_s_max,
                waiting=collective.waiting,
            )
        waiter = next((w for w in judgement.waited_for.get(chosen.process, ()) if _over(w, ratio, min_s)), None)
        if waiter is not None and chosen.collective is None:  # the rule named it: a waiter would have been
            chosen = _others_waited(chosen, waiter, judgement.phases[(waiter.process.role, waiter.phase)])
        out.append(chosen)
    return out


def _others_waited(chosen: Lateness, waiter: Lateness, times: PhaseTimes) -> Lateness:
    """``chosen`` named by the shortest-sync rule: the others waited for it in ``waiter``'s phase,
    the furthest of them ``waited_s_max`` longer than it spent there (the step's
    ``straggler/<phase>/waited_s_max``), ``waiting`` of them longer at all."""
    own = times.seconds.get(chosen.process, 0.0)
    others = [s for p, s in times.seconds.items() if p is not chosen.process]
    return replace(
        chosen,
        sync_phase=waiter.phase,
        waited_s_max=max(0.0, waiter.seconds - own),
        waiting=sum(s > own for s in others),
    )


def _over(cause: Lateness, ratio: float, min_s: float) -> bool:
    return cause.ratio >= ratio and cause.excess_s >= min_s


def straggler_metrics(judgement: Judgement, stamp: float) -> tuple[list[Metric], dict[str, str]]:
    """The step's ``straggler/*`` keys: per traced phase its furthest process (``late_rank``; of
    the role where it is furthest over the others, when several roles trace the name), how far
    over the others (``late_s``, ``over_others``) and the longest collective wait in it
    (``waited_s_max``; a phase whose furthest process only waited there, by the shortest-sync
    rule, has that wait and no ``late_rank``); per collective op its latest last arrival (``comm/{op}/late_rank``,
    ``late_s`` after the others' mean arrival, ``waited_s_max`` of the first to arrive); and the
    label of the process each ``late_rank`` names (ranks of different roles share the numbering)."""
    out: list[Metric] = []
    labels: dict[str, str] = {}

    def add(prefix: str, name: str, value: float) -> None:
        out.append(Metric(f"{attr.STRAGGLER_PREFIX}{prefix}/{name}", value, Reduce.MAX, stamp))

    by_name: dict[str, tuple[Lateness | None, float]] = {}
    for key, times in judgement.phases.items():
        furthest = times.furthest()
        if furthest is None:
            continue
        waited = max(times.waited.values(), default=0.0)
        waiter = judgement.waiters.get(key)
        if waiter is not None:  # its furthest only waited (the shortest-sync rule): a wait, no late rank
            waited, furthest = max(waited, waiter.seconds - min(times.seconds.values())), None
        held = by_name.get(times.name)
        if held is None:
            by_name[times.name] = (furthest, waited)
            continue
        if furthest is None or (held[0] is not None and held[0].excess_s >= furthest.excess_s):
            furthest = held[0]
        by_name[times.name] = (furthest, max(waited, held[1]))
    for name in sorted(by_name)[:MAX_NAMED]:
        furthest, waited = by_name[name]
        if furthest is None:
            add(name, "waited_s_max", waited)
            continue
        add(name, "late_rank", float(furthest.process.rank))
        labels[out[-1].key] = furthest.process.label
        add(name, "late_s", furthest.excess_s)
        add(name, "over_others", min(furthest.ratio, 1e9))
        add(name, "waited_s_max", waited)
    for op in sorted(judgement.collectives)[:MAX_NAMED]:
        late = judgement.collectives[op]
        prefix = f"{COMM_PREFIX}{op}"
        add(prefix, "late_rank", float(late.process.rank))
        labels[out[-1].key] = late.process.label
        add(prefix, "late_s", late.late_s or 0.0)
        add(prefix, "waited_s_max", late.waited_s_max or 0.0)
    return out, labels


def record_of(late: Lateness) -> Straggler:
    """A straggler as the detectors read it; its streak's steps are the detector's
    (``views.detectors.stragglers``)."""
    p = late.process
    return Straggler(
        process=p.label,
        role=p.role,
        replica=p.replica,
        rank=p.rank,
        phase=late.phase,
        collective=late.collective,
        ratio=round(min(late.ratio, 1e9), 3),
        excess_s=round(late.excess_s, 6),
        seconds=round(late.seconds, 6),
        others_s=round(late.others_s, 6),
        late_s=None if late.late_s is None else round(late.late_s, 6),
        waited_s_max=None if late.waited_s_max is None else round(late.waited_s_max, 6),
        waiting=late.waiting,
        rule=late.rule,
        sync_phase=late.sync_phase,
    )
