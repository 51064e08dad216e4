"""What went wrong, for the page's health section: the anomalies (and the straggler streaks
they name), the steps that went without some processes, the late updates.

A late update is a process's data for a step that arrived after the sink had finalized the
step. The sink merges it into the step's kept states and writes the step again (its record:
``corrected``), so the step's values are its exact total again: nothing to do. Past the window
the sink keeps finalized steps for (``retain_seconds``, ``retain_bytes``) it cannot: the step's
values stay as written, lacking that data (its record: ``partial``). Only those need attention.

A sink's straggler record is one streak (``first_step``): the process that held the others up,
the phase its time went to, by how much over the others' mean, and the collective it arrived
last at with how long the others waited for it. It comes when the streak starts (one step); a
later copy of it (the same process and first step: the sink's record as the streak went on, in
an anomaly or a ``status`` event's ``anomalies``) updates that streak (its last step, and the
phase and figures of its latest step), never adds one.
Records of a sink that named a straggler at every step (no ``first_step``) are folded into
streaks of consecutive steps.

Bounded however long the run: the first and last ``MAX_ANOMALIES`` anomalies (all counted by
type), the last ``MAX_LISTED`` steps with missing processes (16 named each) and late steps.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..core.anomalies import Corrected, Partial, Straggler
from .values import MAX_LISTED, cell, integer, listed, mapping, number, strict, text

MAX_ANOMALIES = 250
STRAGGLER = Straggler.KIND
LATE_KINDS = (Corrected.KIND, Partial.KIND)
"""A late update's records: merged into its step, or not (module docstring)."""


class Health:
    """Anomalies, missing processes and late updates (module docstring)."""

    def __init__(self) -> None:
        self.anomalies_first: list[dict[str, Any]] = []
        self.anomalies_last: deque[dict[str, Any]] = deque(maxlen=MAX_ANOMALIES)
        self.anomaly_counts: dict[str, int] = {}
        self.missing: deque[dict[str, Any]] = deque(maxlen=MAX_LISTED)
        self.late: dict[int, int] = {}
        """Step → its late updates (the ``MAX_LISTED`` largest steps)."""
        self.late_updates = 0
        self.late_from: dict[int, dict[str, Any]] = {}
        """Step → who its late updates came from (the first 16) and whether every one was merged
        into the step (``merged``: False once a ``partial`` record came), the ``MAX_LISTED`` largest steps."""

    def anomaly(self, event: dict[str, Any]) -> None:
        kind = text(event.get("type", "?"))[:64]
        clean = _record(event)
        if kind == STRAGGLER and self._extend(clean):
            return
        if kind in LATE_KINDS:
            self._late_record(kind, event)
        self.anomaly_counts[kind] = self.anomaly_counts.get(kind, 0) + 1
        if len(self.anomalies_first) < MAX_ANOMALIES:
            self.anomalies_first.append(clean)
        else:
            self.anomalies_last.append(clean)

    def streaks(self, records: Any) -> None:
        """The sink's latest records (a ``status`` event's ``anomalies``): its straggler streaks
        as they went on update the ones held (or are added, when the view came after their start)."""
        for record in records[:64] if isinstance(records, list) else ():
            if isinstance(record, dict) and record.get("type") == STRAGGLER:
                self.anomaly(record)

    def _extend(self, record: dict[str, Any]) -> bool:
        """A later copy of a held streak's record updates it (an older one changes nothing); False:
        no streak held is this one's."""
        first = integer(record.get("first_step"))
        if first is None:
            return False
        who = (record.get("process"), first)  # the sink's streak: a process, whatever phase its time went to
        for held in reversed(self.anomalies()):
            if held.get("type") == STRAGGLER and (held.get("process"), held.get("first_step")) == who:
                newer = (integer(record.get("last_step")) or 0) >= (integer(held.get("last_step")) or 0)
                if newer:  # its latest step's phase and figures (an older state changes nothing)
                    held.update({k: v for k, v in record.items() if k != "step"})
                return True
        return False

    def missed(self, step: int, processes: Any) -> None:
        """A step that went without ``processes`` (labels)."""
        names = [text(m) for m in processes[:16]]
        self.missing.append({"step": step, "count": len(processes), "processes": names})

    def late_update(self, step: int) -> None:
        self.late[step] = self.late.get(step, 0) + 1
        self.late_updates += 1
        if len(self.late) > MAX_LISTED:
            self.late.pop(min(self.late))

    def _late_record(self, kind: str, record: dict[str, Any]) -> None:
        """A late update's record (as the event has it): who sent it, and whether it was merged into its step."""
        step = integer(record.get("step"))
        if step is None:
            return
        held = self.late_from.setdefault(step, {"processes": [], "merged": True})
        found = record.get("processes")
        for name in found[:64] if isinstance(found, list) else ():
            if len(held["processes"]) < 16 and text(name) not in held["processes"]:
                held["processes"].append(text(name))
        held["merged"] = held["merged"] and kind == Corrected.KIND
        if len(self.late_from) > MAX_LISTED:
            self.late_from.pop(min(self.late_from))

    def unmerged(self) -> int:
        """Late updates the sink could not merge into their step (``partial``: the step's values lack them)."""
        return self.anomaly_counts.get(Partial.KIND, 0)

    def anomalies(self) -> list[dict[str, Any]]:
        return self.anomalies_first + list(self.anomalies_last)

    def stragglers(self) -> list[dict[str, Any]]:
        """Each straggler streak: who, in which phase, its first and last step and how many steps,
        its seconds over the others' mean and its ratio, the collective it arrived last at, how
        many waited and the longest wait (or the phase they waited in, where no collective span
        showed it); the longest streaks first, then the earliest."""
        found: list[dict[str, Any]] = []
        going: dict[tuple[str, str], dict[str, Any]] = {}
        for record in self.anomalies():
            if record.get("type") != STRAGGLER:
                continue
            who = (str(record.get("process")), str(record.get("phase") or ""))  # "": late to a collective only
            first = integer(record.get("first_step"))  # None: an older sink's record of one step
            step = first if first is not None else integer(record.get("step"))
            seen = going.get(who)
            if first is None and seen is not None and step is not None and step - seen["last"] in (0, 1):
                seen["steps"] += step - seen["last"]  # a sink that said each step: one streak of them
                seen["last"] = step
                continue
            last = max(integer(record.get("last_step")) or -1, -1 if step is None else step)
            streak: dict[str, Any] = {"process": who[0], "phase": who[1], "rank": integer(record.get("rank"))}
            streak.update(first=step)
            streak.update(last=None if step is None else last, steps=max(integer(record.get("steps")) or 1, 1))
            streak.update({k: number(record.get(k)) for k in ("ratio", "excess_s", "late_s", "waited_s_max")})
            collective = record.get("collective")
            streak.update(collective=collective if isinstance(collective, str) else None)
            sync_phase = record.get("sync_phase")  # the shortest-sync rule: the phase the others waited in
            streak.update(sync_phase=sync_phase if isinstance(sync_phase, str) else "")
            streak.update(waiting=integer(record.get("waiting")) or 0)
            found.append(streak)
            if step is not None:
                going[who] = streak
        return sorted(found, key=lambda s: (-s["steps"], -1 if s["first"] is None else s["first"], s["process"]))

    def state(self) -> dict[str, Any]:
        """This part of a ``snapshot`` event."""
        return {
            "anomalies_first": self.anomalies_first,
            "anomalies_last": list(self.anomalies_last),
            "anomaly_counts": self.anomaly_counts,
            "missing": list(self.missing),
            "late": [[step, n] for step, n in self.late.items()],
            "late_updates": self.late_updates,
            "late_from": [[step, held] for step, held in self.late_from.items()],
        }

    @classmethod
    def restore(cls, event: dict[str, Any]) -> Health:
        """The part a snapshot holds, checked (``ValueError``: malformed)."""
        new = cls()
        new.anomalies_first = [_record(r) for r in listed(event["anomalies_first"], MAX_ANOMALIES)]
        new.anomalies_last.extend(_record(r) for r in listed(event["anomalies_last"], MAX_ANOMALIES))
        new.anomaly_counts = {text(kind)[:64]: strict(n) for kind, n in mapping(event["anomaly_counts"]).items()}
        new.missing.extend(
            {
                "step": strict(m["step"]),
                "count": strict(m["count"]),
                "processes": [text(p) for p in m["processes"][:16]],
            }
            for m in listed(event["missing"])
        )
        new.late = {strict(step): strict(n) for step, n in listed(event["late"])}
        new.late_updates = strict(event["late_updates"])
        for step, held in listed(event.get("late_from") or []):  # absent from an earlier rankscope's snapshot
            processes = [text(p) for p in listed(mapping(held)["processes"], 16)]
            new.late_from[strict(step)] = {"processes": processes, "merged": held["merged"] is True}
        return new

    def data(self) -> dict[str, Any]:
        """This part of the page's data."""
        return {
            "stragglers": self.stragglers(),
            "anomalies": self.anomalies(),
            "anomaly_counts": self.anomaly_counts,
            "missing": list(self.missing),
            "late": [{"step": s, "updates": n, **self.late_from.get(s, {})} for s, n in sorted(self.late.items())],
            "late_updates": self.late_updates,
            "late_unmerged": self.unmerged(),
        }


def _record(event: dict[str, Any]) -> dict[str, Any]:
    """An anomaly's fields as cells (at most 32, less its ``kind``)."""
    return {str(k)[:64]: cell(v) for k, v in list(event.items())[:32] if k != "kind"}
