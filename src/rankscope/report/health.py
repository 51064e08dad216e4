"""What went wrong, for the page's health section: the anomalies (and the stragglers they
name), the steps that went without some processes, the late updates.

Bounded however long the run: the first and last ``MAX_ANOMALIES`` anomalies (all counted by
type), the last ``MAX_LISTED`` steps with missing processes (16 named each) and late steps.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .values import MAX_LISTED, cell, listed, mapping, number, strict, text

MAX_ANOMALIES = 250


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

    def anomaly(self, event: dict[str, Any]) -> None:
        kind = text(event.get("type", "?"))[:64]
        self.anomaly_counts[kind] = self.anomaly_counts.get(kind, 0) + 1
        clean = _record(event)
        if len(self.anomalies_first) < MAX_ANOMALIES:
            self.anomalies_first.append(clean)
        else:
            self.anomalies_last.append(clean)

    def missed(self, step: int, processes: Any) -> None:
        """A step that went without ``processes`` (labels)."""
        names = [text(m) for m in processes[:16]]
        self.missing.append({"step": step, "count": len(processes), "processes": names})

    def late_update(self, step: int) -> None:
        self.late[step] = self.late.get(step, 0) + 1
        self.late_updates += 1
        if len(self.late) > MAX_LISTED:
            self.late.pop(min(self.late))

    def anomalies(self) -> list[dict[str, Any]]:
        return self.anomalies_first + list(self.anomalies_last)

    def stragglers(self) -> list[dict[str, Any]]:
        """Each (process, phase) named a straggler, with how often and its first and worst step."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for record in self.anomalies():
            if record.get("type") != "straggler":
                continue
            who = (str(record.get("process")), str(record.get("phase")))
            ratio = number(record.get("ratio")) or 0.0
            seen = found.setdefault(who, {"process": who[0], "phase": who[1], "steps": 0, "first": record.get("step")})
            seen["steps"] += 1
            if ratio >= seen.get("ratio", 0.0):
                seen.update(ratio=ratio, worst=record.get("step"), seconds=number(record.get("seconds")))
        return sorted(found.values(), key=lambda s: (-s["steps"], s["process"]))

    def state(self) -> dict[str, Any]:
        """This part of a ``snapshot`` event."""
        return {
            "anomalies_first": self.anomalies_first,
            "anomalies_last": list(self.anomalies_last),
            "anomaly_counts": self.anomaly_counts,
            "missing": list(self.missing),
            "late": [[step, n] for step, n in self.late.items()],
            "late_updates": self.late_updates,
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
        return new

    def data(self) -> dict[str, Any]:
        """This part of the page's data."""
        return {
            "stragglers": self.stragglers(),
            "anomalies": self.anomalies(),
            "anomaly_counts": self.anomaly_counts,
            "missing": list(self.missing),
            "late": [{"step": s, "updates": n} for s, n in sorted(self.late.items())],
            "late_updates": self.late_updates,
        }


def _record(event: dict[str, Any]) -> dict[str, Any]:
    """An anomaly's fields as cells (at most 32, less its ``kind``)."""
    return {str(k)[:64]: cell(v) for k, v in list(event.items())[:32] if k != "kind"}
