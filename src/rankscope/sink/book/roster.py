"""Who a step waits for: one run's processes, their labels and attempts, and whom it gave up on.

* A process that has ever sent a flush marker is *stepped*: step N waits for its marker N.
* Processes that declare ``rankscope.world_size`` W fill W rank slots of their (role, replica,
  attempt) group; an empty slot is waited for like a process.
* A step that finalizes without someone names them once (``give_up``); they are not waited for
  again until they report.
* A higher attempt (a restart) retires every process of the earlier ones.
* Through a Collector tree, ranks close steps in merged markers (``closed_ranks``): their slots are
  held without a ``Process`` each, and a missing one is named by its group and rank.

Its ``Process`` lives in ``sink.checked``: every stage, the views too, names values by it.

Pure bookkeeping: no clock, no I/O. ``version`` moves whenever the answer to "who is missing"
may have changed, so the step book re-asks only then.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from ...core import names as attr
from ...core.identity import label_of
from ...otlp.markers import Ranks
from ..checked import Group, Process
from .closed_ranks import ClosedRanks

Absent = tuple[str, Any]
"""(label, what to stop waiting for: a Process, a (group, rank) slot, or None)."""


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class Roster:
    """The run's processes and rank slots, and who of them a step still waits for."""

    def __init__(self, max_processes: int = 16_384, max_slots: int = 131_072) -> None:
        self.max_processes = max_processes
        self.max_slots = max_slots
        """Rank slots a run's groups may declare in all, per attempt (processes' world sizes and
        merged markers' alike): ``absent`` may name each empty one."""
        self.closed = ClosedRanks()
        self.processes: dict[str, Process] = {}
        self.attempt = 0
        """The run's current attempt (the highest any process declared)."""
        self.version = 0
        """Moves whenever who a step waits for may have changed."""
        self._labels: dict[str, str] = {}
        self._given_up: dict[Group, set[int]] = {}
        """Per group, its ranks named missing and not reported since (``give_up``)."""
        self._slots: dict[Group, int] = {}
        """Rank slots each group declared (its largest world size)."""
        self._slot_total: dict[int, int] = {}
        """Rank slots declared per attempt, all groups together (``_declared``)."""
        self._seen: dict[int, int] = {}
        self._open: dict[int, int] = {}
        """Processes per attempt, and those of them that have not said goodbye (``attempt_ended``)."""
        self._filled: tuple[tuple[int, int], bool] = ((-1, -1), False)
        """((version, processes), every declared rank slot of the attempt held) as ``finished`` last found it."""
        self.unplaced_rank_sets = 0
        """Merged markers of a new group that found every rank slot of the run held (``max_slots``)."""
        self.fallbacks: list[str] = []
        """Processes whose attempt fell back to their node's restart count (``ATTEMPT_FALLBACK``): the first 64."""
        self.fallback_count = 0
        self._failures: list[Process] = []
        """Processes whose goodbye said an exception ended them, in the order those goodbyes came:
        the first is the likeliest cause, as the others often failed because it did (a collective's
        peer gone)."""

    def process_for(self, resource: Mapping[str, Any]) -> Process | None:
        """The sending process (created on first sight), or None past ``max_processes``. A process
        of a higher attempt starts that attempt (``new_attempt``): check ``attempt`` after."""
        pid = str(resource.get(attr.SERVICE_INSTANCE_ID) or resource.get(attr.PROCESS_PID) or "?")
        if resource.get(attr.MERGED) is True:  # a Collector merges every attempt under one instance id
            pid = f"{pid}@{_int(resource.get(attr.EXPERIMENT_ATTEMPT), 0)}"
        found = self.processes.get(pid)
        if found is None:
            if len(self.processes) >= self.max_processes:
                return None
            found = self._new_process(pid, resource)
        return found

    def _new_process(self, pid: str, resource: Mapping[str, Any]) -> Process:
        role = str(resource.get(attr.ROLE) or resource.get(attr.SERVICE_NAME) or "unknown")
        replica = resource.get(attr.REPLICA)
        rank = _int(resource.get(attr.RANK), 0)
        label = slot = label_of(role, replica, rank)
        attempt = _int(resource.get(attr.EXPERIMENT_ATTEMPT), 0)
        owner = self.processes.get(self._labels.get(label, ""))
        if owner is not None and owner.live and owner.attempt >= attempt:  # a higher attempt retires it below
            label = f"{label}_{resource.get(attr.PROCESS_PID, pid)}"  # two live processes claim one slot
        process = Process(
            id=pid,
            label=label,
            role=role,
            replica=None if replica is None else str(replica),
            rank=rank,
            world_size=1  # a Collector's merge holds no rank slot
            if resource.get(attr.MERGED) is True
            else self._declared(
                (role, None if replica is None else str(replica), attempt),
                max(1, _int(resource.get(attr.WORLD_SIZE), 1)),
            ),
            attempt=attempt,
            host=str(resource.get(attr.HOST_NAME, "")),
            pid=_int(resource.get(attr.PROCESS_PID), 0) or None,
            resource=dict(resource),
            merged=resource.get(attr.MERGED) is True,
        )
        others = [p for p in self.processes.values() if not p.merged]
        held = self.processes.get(self._labels.get(slot, ""))
        process.suspect = (  # its slot's process ended, as did every other: maybe a second launch
            not process.merged
            and held is not None
            and held.ended
            and held.attempt == attempt == self.attempt
            and all(p.ended for p in others)
            and not any((p.host, p.pid) == (process.host, process.pid) for p in others)  # not a re-init
        )
        self.processes[pid] = process
        if resource.get(attr.ATTEMPT_FALLBACK):  # its rendezvous round unread: its attempt may be wrong
            self.fallback_count += 1
            if len(self.fallbacks) < 64:
                self.fallbacks.append(label)
        self._seen[attempt] = self._seen.get(attempt, 0) + 1
        self._open[attempt] = self._open.get(attempt, 0) + 1
        if not process.merged:
            self._labels[label] = pid
        if attempt > self.attempt:
            self.new_attempt(attempt)
        return process

    def _declared(self, group: Group, world_size: int) -> int:
        """``world_size`` as a new process (or a merged marker) of ``group`` may declare it: a run's
        groups hold at most ``max_slots`` rank slots in all, since ``absent`` lists every empty one on
        the finalizer all runs share (a made-up size, or many groups of one, would have it list millions)."""
        held = self._slots.get(group, 0)
        if world_size <= held:
            return world_size
        total = self._slot_total.get(group[2], 0)
        world_size = max(1, min(world_size, self.max_slots - total + held))
        if world_size > held:
            self._slots[group] = world_size
            self._slot_total[group[2]] = total - held + world_size
        return world_size

    def new_attempt(self, attempt: int) -> None:
        """The run restarted: every process of an earlier attempt is no longer waited for."""
        self.version += 1
        self.attempt = attempt
        for p in self.processes.values():
            if p.attempt < attempt:
                p.live = False
        self.closed.retire(attempt)  # an earlier attempt's slots are never asked again
        for table in (self._slots, self._given_up):
            for group in [g for g in table if g[2] < attempt]:
                del table[group]

    def marked(self, process: Process, step: int) -> None:
        """``process`` closed ``step`` (its flush marker): it steps, it is live, its slot is filled."""
        self.version += 1
        process.stepped = True
        process.live = True
        process.last_marker = max(process.last_marker, step)
        self._given_up.get(process.group, set()).discard(process.rank)

    def ranks_marked(self, attempt: int, ranks: Ranks, step: int) -> None:
        """The ranks of a merged marker closed ``step``: their slots are held, those given up on
        are waited for again. A new group past ``max_slots`` is not kept (``unplaced_rank_sets``)."""
        group = (ranks.role, ranks.replica, attempt)
        if attempt < self.attempt:
            return
        if group not in self._slots and self._slot_total.get(attempt, 0) >= self.max_slots:
            self.unplaced_rank_sets += 1  # every slot is held: a new group could only add names
            return
        self.version += 1
        size = self._declared(group, ranks.world_size)
        self.closed.close(group, size, ranks, step)
        given = self._given_up.get(group)
        if given:
            closed = self.closed.closed(group, step)
            if closed is not None:
                given.difference_update([r for r in given if r < len(closed) and closed[r]])

    def came_back(self, process: Process) -> None:
        """A process given up on (or that said goodbye) sent data again."""
        if not process.live and process.attempt >= self.attempt:
            process.live = True
            if process.ended:
                self._open[process.attempt] += 1
            process.ended = False
            self.version += 1

    def ended(self, process: Process) -> None:
        """It said goodbye: not waited for again."""
        process.live = False
        if not process.ended:
            self._open[process.attempt] -= 1
            if process.exit_error and process not in self._failures:  # one that came back fails once
                self._failures.append(process)
        process.ended = True
        self.version += 1

    def failed(self, most: int = 8) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The processes of the current attempt an exception ended (their goodbye said which): their
        labels and their errors (``Type: message``), the first ``most`` in the order their goodbyes came."""
        now = self.attempt
        kept = [(p.label, p.exit_error) for p in self._failures if p.attempt == now][:most]
        return tuple(label for label, _ in kept), tuple(error or "" for _, error in kept)

    def died_in(self, finalized: int, horizon: int) -> tuple[int, list[str]] | None:
        """The step the first failure of the current attempt died in, when nothing holds it yet
        (past ``finalized``, the run's last finalized step), and who was in it. A rank that raised
        before it recorded anything in its step (a framework that logs only every n steps) leaves
        no open step for the record of the job's end to go in. The step is the one its goodbye
        named (``set_step``'s: a logged step ahead) when that is past its last close and within
        ``horizon``, else the one after its last close; who was in it: the attempt's processes whose
        last close was the failed one's."""
        now = self.attempt
        first = next((p for p in self._failures if p.attempt == now and (p.stepped or p.exit_step is not None)), None)
        if first is None or first.last_marker < finalized:
            return None
        last, said = first.last_marker, first.exit_step
        step = said if said is not None and last < said <= horizon else last + 1
        return step, [p.label for p in self.processes.values() if p.attempt == now and p.last_marker == last]

    @property
    def all_ended(self) -> bool:
        """Every process said goodbye: the run is over (its views close once it is idle)."""
        return bool(self.processes) and all(p.ended for p in self.processes.values())

    @property
    def attempt_ended(self) -> bool:
        """Every process of the run's current attempt said goodbye. Constant time: a goodbye asks."""
        return self._seen.get(self.attempt, 0) > 0 and self._open.get(self.attempt, 0) == 0

    @property
    def finished(self) -> bool:
        """The run's current attempt is over: every process of it said goodbye, and every rank slot
        it declared (``rankscope.world_size``) was held by one (a rank that never reported may still
        come: it is late, not another launch). ``runs.runbook`` then closes the run to the attempt once
        the sink's grace has passed. Walks the processes only once they have all said goodbye."""
        if not self.attempt_ended:
            return False
        at = (self.version, len(self.processes))
        if self._filled[0] != at:
            held: dict[Group, set[int]] = {}
            for p in self.processes.values():
                if p.attempt == self.attempt and not p.merged:
                    held.setdefault(p.group, set()).add(p.rank)
            declared = [(g, size) for g, size in self._slots.items() if g[2] == self.attempt]
            self._filled = (at, all(not len(self._empty(g, size, held.get(g, set()), 0)) for g, size in declared))
        return self._filled[1]

    def _empty(self, group: Group, size: int, held: set[int], step: int) -> np.ndarray:
        """The ranks of ``group`` (``size`` of them) neither in ``held`` nor closed ``step`` or later
        in a merged marker, ascending."""
        mask = np.zeros(size, dtype=bool)
        if held:
            inside = [r for r in held if r < size]
            mask[inside] = True
        closed = self.closed.closed(group, step)
        if closed is not None:
            n = min(size, len(closed))
            mask[:n] |= closed[:n]
        return np.flatnonzero(~mask)

    @property
    def stepping(self) -> bool:
        """Whether any process of the run has closed a step (its own marker or a merged one)."""
        return bool(self.closed) or any(p.stepped for p in self.processes.values())

    def ranks(self) -> int:
        """Ranks of the current attempt known to have closed a step or sent data: what the status
        route counts, through a tree too (where most ranks have no ``Process``)."""
        held: dict[Group, set[int]] = {}
        for p in self.processes.values():
            if p.attempt == self.attempt and not p.merged:
                held.setdefault(p.group, set()).add(p.rank)
        total = 0
        for group, size in self.closed.groups(self.attempt):
            total += size - len(self._empty(group, size, held.pop(group, set()), 0))
        return total + sum(len(ranks) for ranks in held.values())

    def absent(self, step: int, sent: Collection[str] = ()) -> list[Absent]:
        """Who ``step`` still waits for: live laggards by their label, empty rank slots by theirs.
        ``sent``: the ids of the processes whose own data the step holds (``Step.sent``)."""
        return self._walk(step, sent)[0]

    def away(self, step: int, sent: Collection[str] = ()) -> list[str]:
        """Who is absent from ``step`` but not waited for: named missing at an earlier step
        (``give_up``) and not reported since. The step's view still counts them missing."""
        return self._walk(step, sent)[1]

    def _walk(self, step: int, sent: Collection[str]) -> tuple[list[Absent], list[str]]:
        absent: list[Absent] = []
        away: list[str] = []
        present: dict[Group, set[int]] = {}
        sizes: dict[Group, int] = {}
        stepping = [p for p in self.processes.values() if p.stepped and p.attempt >= self.attempt]
        going_on = {p.group for p in stepping if p.live or p.last_marker >= step}
        for p in stepping:
            sizes[p.group] = max(sizes.get(p.group, 1), p.world_size)
            # A live laggard is named as itself below. One that said goodbye without an error is
            # done when none of its group goes on to the step (a generator's data after the
            # trainer's last step) and it sent nothing of it: one that sent part of it was cut
            # short (Ctrl-C); one whose peers go on left early (uneven inputs): both are missing.
            done = p.ended and not p.exit_error and p.id not in sent and p.group not in going_on
            if p.last_marker >= step or p.live or done:
                present.setdefault(p.group, set()).add(p.rank)
            if p.live and p.last_marker < step:
                absent.append((p.label, p))
        for group, size in self.closed.groups(self.attempt):
            sizes[group] = max(sizes.get(group, 1), size)
        for group, size in sizes.items():
            for rank in self._empty(group, size, present.get(group, set()), step).tolist():
                role, replica, _ = group
                if rank not in self._given_up.get(group, ()):
                    absent.append((label_of(role, replica, rank), (group, rank)))
                else:
                    away.append(label_of(role, replica, rank))
        return absent, away

    def give_up(self, absent: list[Absent]) -> None:
        """Named once, not waited for again until they report (a dead rank costs one grace period)."""
        self.version += 1
        for _, what in absent:
            if isinstance(what, Process):
                what.live = False
                self._given_up.setdefault(what.group, set()).add(what.rank)
            elif what is not None:
                self._given_up.setdefault(what[0], set()).add(what[1])

    def local_pids(self, host: str) -> set[int]:
        return {p.pid for p in self.processes.values() if p.pid and p.host == host}

    def counts(self) -> tuple[int, int]:
        """(processes, merge upstreams): what the status route shows."""
        merged = sum(p.merged for p in self.processes.values())
        return len(self.processes) - merged, merged
