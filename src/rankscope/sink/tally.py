"""The sink's counts across experiments, and what it says about runs, as the status route's overview shows them.

Requests on several threads add to them (gRPC workers, the HTTP pool, the view threads), so each
addition holds one lock. Refusals are counted by kind: a reason without the names and numbers in
it, so a client sending made-up names makes no new kinds; a full table folds new kinds into one
entry rather than being cleared, so nobody can wipe what the operator is looking at. What the
views dropped (a run's inbox full) is counted by the kind of data, across runs, evicted ones too.

``Notes`` are what the sink says about runs (a resume refused or mapped, a log set aside): by
token scope (a scoped token lists its own) and kind, each kind logged at most once per
``NOTE_INTERVAL`` with the count of those not logged, and kept as one entry (its count and
latest example), so 2,000 refusals of one kind write one line and leave the other kinds in the
status route.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .checked import Refusals
from .views.writer import DROP_KINDS

log = logging.getLogger("rankscope.sink")

MAX_REFUSAL_KINDS = 1000
"""Kinds of refusal counted separately."""
FULL = "other reasons (the table of reasons is full)"
_VARYING = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|\d+")
"""What varies within one kind of refusal: quoted names (as ``repr`` quotes them, escapes and
all, so a name holding quotes or colons is one name) and numbers."""


def kind_of(reason: str) -> str:
    """A refusal's kind: its reason after the first key it names, without names and numbers."""
    return _VARYING.sub("…", reason).split(":", 1)[-1].strip()[:80]


class Tally:
    """Refused points by kind, plain OTel points and spans received: the whole sink's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refused = 0
        self.refusals: dict[str, int] = {}
        self.foreign_points = 0
        self.spans_received = 0
        self.view_drops: dict[str, int] = dict.fromkeys(DROP_KINDS, 0)
        """What the views of every run dropped (their inbox full), by kind of data."""

    def refusal(self, refused: Refusals) -> None:
        """A request's refusals, under the kind of its first reason; a kind's first is logged (once:
        the kinds are the sink's own sentences, so a client cannot make it write more lines)."""
        if not refused.count:
            return
        first = None
        with self._lock:
            self.refused += refused.count
            for reason in refused.reasons[:1]:
                kind = kind_of(reason)
                if kind not in self.refusals and len(self.refusals) >= MAX_REFUSAL_KINDS:
                    kind = FULL
                if kind not in self.refusals:
                    first = reason
                self.refusals[kind] = self.refusals.get(kind, 0) + refused.count
        if first is not None:
            log.warning(
                "rankscope sink: refused %d points or records: %s (each kind said once; the status route counts them)",
                refused.count,
                first[:300],
            )

    def foreign(self, points: int) -> None:
        if points:
            with self._lock:
                self.foreign_points += points

    def spans(self, received: int) -> None:
        with self._lock:
            self.spans_received += received

    def view_drop(self, kind: str) -> None:
        """One message a run's views dropped (``views.writer.ViewWriter``: ``step_views``, ...)."""
        with self._lock:
            self.view_drops[kind] = self.view_drops.get(kind, 0) + 1

    def overview(self) -> dict[str, Any]:
        """The status route's counts (the 20 most frequent kinds of refusal)."""
        with self._lock:
            top = dict(sorted(self.refusals.items(), key=lambda kv: -kv[1])[:20])
            return {
                "refused_points": self.refused,
                "refusals": top,
                "foreign_points": self.foreign_points,
                "spans_received": self.spans_received,
                "view_drops": dict(self.view_drops),
            }


NOTE_INTERVAL = 10.0
"""Seconds between two log lines of one kind of note (the others are counted, and said with the next)."""
MAX_NOTE_KINDS = 100
"""Kinds of note kept per owner (the least recently said goes first); the status route shows the newest 20."""


class Notes:
    """What the sink says about runs: logged at most once per ``interval`` per kind (``kind_of``),
    with how many of that kind were not logged since; kept per kind, its count and latest example.

    Each note is its ``owner``'s: the name of the token scope whose request it is about
    (``checked.Scope``; ``""``: the sink's all-experiments scope, and what the sink says on its
    own). Kinds are kept and throttled per owner, so a scoped token lists its own notes only and
    another scope's flood neither silences nor pushes out its kinds."""

    def __init__(
        self,
        *,
        interval: float = NOTE_INTERVAL,
        shown: int = 20,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.interval = interval
        self.shown = shown
        self.clock = clock
        self.logger = logger
        self._lock = threading.Lock()
        self._kinds: OrderedDict[tuple[str, str], _Note] = OrderedDict()
        """(owner, kind) -> its note, the most recently said last."""

    def add(self, note: str, owner: str = "") -> None:
        """Say ``note`` (``owner``'s): logged (WARNING) unless one of its kind and owner was logged
        within ``interval``."""
        key = (owner, kind_of(note))
        now = self.clock()
        with self._lock:
            found = self._kinds.pop(key, None)
            if found is None:
                found = _Note(now - self.interval)
                self._make_room(owner)
            self._kinds[key] = found
            found.count += 1
            found.latest = note
            if now - found.logged < self.interval:
                found.unlogged += 1
                return
            unlogged, found.unlogged, found.logged = found.unlogged, 0, now
        more = f" (and {unlogged} more like it in the last {self.interval:g} s)" if unlogged else ""
        self.logger.warning("rankscope sink: %s%s", note, more)

    def _make_room(self, owner: str) -> None:
        """Forget ``owner``'s least recently said kinds past ``MAX_NOTE_KINDS`` (under the lock)."""
        held = [key for key in self._kinds if key[0] == owner]
        for key in held[: max(0, len(held) - MAX_NOTE_KINDS + 1)]:
            del self._kinds[key]

    def listed(self, owner: str | None = None) -> list[str]:
        """The newest ``shown`` kinds (``owner``'s only; None: everyone's), oldest first: each its
        latest note, with its count when over one."""
        with self._lock:
            kinds = [n for (o, _), n in self._kinds.items() if owner is None or o == owner][-self.shown :]
            return [n.latest if n.count == 1 else f"{n.latest} [{n.count} of this kind]" for n in kinds]


class _Note:
    __slots__ = ("count", "latest", "logged", "unlogged")

    def __init__(self, logged: float) -> None:
        self.count = 0
        self.latest = ""
        self.logged = logged
        """Clock time of its kind's last log line."""
        self.unlogged = 0
