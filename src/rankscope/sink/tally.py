"""The sink's counts across experiments, as the status route's overview shows them.

Requests on several threads add to them (gRPC workers, the HTTP pool), so each addition holds
one lock. Refusals are counted by kind: a reason without the names and numbers in it, so a
client sending made-up names makes no new kinds; a full table folds new kinds into one entry
rather than being cleared, so nobody can wipe what the operator is looking at.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from .checked import Refusals

MAX_REFUSAL_KINDS = 1000
"""Kinds of refusal counted separately."""
FULL = "other reasons (the table of reasons is full)"
_VARYING = re.compile(r"'[^']*'|\"[^\"]*\"|\d+")
"""What varies within one kind of refusal (quoted names, numbers)."""


def kind_of(reason: str) -> str:
    """A refusal's kind: its reason after the first key it names, without names and numbers."""
    return _VARYING.sub("…", reason.split(":", 1)[-1].strip())[:80]


class Tally:
    """Refused points by kind, plain OTel points and spans received: the whole sink's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refused = 0
        self.refusals: dict[str, int] = {}
        self.foreign_points = 0
        self.spans_received = 0

    def refusal(self, refused: Refusals) -> None:
        """A request's refusals, under the kind of its first reason."""
        if not refused.count:
            return
        with self._lock:
            self.refused += refused.count
            for reason in refused.reasons[:1]:
                kind = kind_of(reason)
                if kind not in self.refusals and len(self.refusals) >= MAX_REFUSAL_KINDS:
                    kind = FULL
                self.refusals[kind] = self.refusals.get(kind, 0) + refused.count

    def foreign(self, points: int) -> None:
        if points:
            with self._lock:
                self.foreign_points += points

    def spans(self, received: int) -> None:
        with self._lock:
            self.spans_received += received

    def overview(self) -> dict[str, Any]:
        """The status route's counts (the 20 most frequent kinds of refusal)."""
        with self._lock:
            top = dict(sorted(self.refusals.items(), key=lambda kv: -kv[1])[:20])
            return {
                "refused_points": self.refused,
                "refusals": top,
                "foreign_points": self.foreign_points,
                "spans_received": self.spans_received,
            }
