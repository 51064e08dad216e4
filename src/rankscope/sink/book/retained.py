"""Finalized steps kept for their late data: a window in bytes and seconds, not in steps.

A node cut off for two minutes sends its steps when it is back; each must merge into what came in
time, so the step's correction is its exact total. Keeping every step's running states live costs
an object per key per step; so only the last ``HOT`` finalized steps stay live, and older ones are
packed (pickled, zlib: 6 to 14 bytes a key, 0.8 ms a step of 1,000 keys) and kept while they are
younger than ``retain_seconds`` and the run's packed steps fit in ``retain_bytes``. The default
(900 s, 64 MiB) keeps a 10-minute outage at 1 step/s of 1,000 keys (8.6 MB) with room to spare, and
at 4 steps/s (34 MB). All runs' packed steps share one ``Retention`` (``SinkConfig.retained_bytes``):
a run that finds it spent lets go of its own oldest steps first, and a step that still finds no
room is not kept (counted). A late part of a step no longer kept is partial: the book writes it as
a ``partial`` record, never as the step's value (``docs/sink.md``, "Late data").

A run with a write-ahead log also writes each step kept to its ``kept.log`` (``durable.kept``),
so a restarted sink reads the window back. The packed bytes are the sink's own, made from checked
data (never a client's bytes): ``pickle`` reads back what this sink wrote, from its own state
directory (files of mode 0600, as its log's).
"""

from __future__ import annotations

import pickle
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable

from ..durable.kept import KeptFile
from .step import Step

HOT = 16
"""Finalized steps kept live (the late data of a straggler a few steps behind merges at no cost)."""


class Retention:
    """The bytes all runs' packed steps may hold together (``SinkConfig.retained_bytes``)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Hold ``n`` bytes, or False when they do not fit."""
        with self._lock:
            if self.held + n > self.max_bytes:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


class Retained:
    """One run's finalized steps: the last ``HOT`` live, older ones packed within the window.
    A step is taken out for its late data (``take``) and kept again once its update is written.
    With a ``KeptFile`` (``attach``: a run with a write-ahead log) each step kept is also written
    there, so a restarted sink reads the window back."""

    def __init__(self, *, max_bytes: int, max_seconds: float, retention: Retention | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.retention = retention
        self.hot: OrderedDict[int, Step] = OrderedDict()
        self.packed: OrderedDict[int, tuple[float, bytes]] = OrderedDict()
        """Step -> (when it was finalized, its packed state), oldest first."""
        self.bytes = 0
        self.unkept = 0
        """Steps let go before their window ended: the sink-wide bytes were spent."""
        self.file: KeptFile | None = None
        self._wall: Callable[[], float] = time.time
        self._blobs: dict[int, bytes] = {}
        """The live steps' packed states as written to the file (packed again only if they change)."""

    def attach(self, file: KeptFile, now: float, wall: Callable[[], float] = time.time) -> None:
        """Write every step kept from now on to ``file``, and read back what it holds (a restarted
        sink): the steps still within the window, packed, oldest first."""
        self.file, self._wall = file, wall
        age_now = wall()
        for step, (finalized, blob) in sorted(file.read().items()):
            age = age_now - finalized
            if age <= self.max_seconds and step not in self:
                self._store(step, now - age, blob)
        self._compact(now)

    def keep(self, step: Step, now: float) -> None:
        """``step`` is finalized (or its late update written): kept for later late data."""
        if self.max_seconds <= 0 or self.max_bytes <= 0:
            return
        self._forget(step.step)  # a copy read back from the file is older than this one
        self.hot[step.step] = step
        self.hot.move_to_end(step.step)
        if self.file is not None:
            blob = self._blobs[step.step] = _packed(step)
            self.file.append(step.step, self._wall() - (now - step.finalized), blob)
        while len(self.hot) > HOT:
            _, oldest = self.hot.popitem(last=False)
            self._store(oldest.step, oldest.finalized, self._blobs.pop(oldest.step, b"") or _packed(oldest))
        self.expire(now)
        self._compact(now)

    def take(self, step: int, now: float) -> Step | None:
        """Finalized ``step`` out of the window for its late data (None: not kept, past the window
        at ``now``, or never finalized)."""
        self.expire(now)
        found = self.hot.pop(step, None)
        if found is not None:
            self._blobs.pop(step, None)
            return found if now - found.finalized <= self.max_seconds else None
        packed = self.packed.pop(step, None)
        if packed is None:
            return None
        self._release(len(packed[1]))
        thawed: Step = pickle.loads(zlib.decompress(packed[1]))
        thawed.finalized, thawed.tables = packed[0], False
        return thawed

    def peek(self, step: int) -> Step | None:
        """A kept step, left in place (a packed one read back): what admission weighs late data against."""
        found = self.hot.get(step)
        if found is not None:
            return found
        packed = self.packed.get(step)
        return None if packed is None else pickle.loads(zlib.decompress(packed[1]))

    def expire(self, now: float) -> None:
        """Let go of packed steps older than the window."""
        while self.packed:
            step, (finalized, blob) = next(iter(self.packed.items()))
            if now - finalized <= self.max_seconds:
                return
            del self.packed[step]
            self._release(len(blob))

    def clear(self) -> None:
        """A restarted run: its steps are executed again (the file too)."""
        self.let_go()
        if self.file is not None:
            self.file.clear()

    def let_go(self) -> None:
        """A closed run (and ``clear``): its bytes go back to the sink's; its file stays (it goes with
        its log's directory)."""
        self.hot.clear()
        self._blobs.clear()
        for _, blob in self.packed.values():
            self._release(len(blob))
        self.packed.clear()

    def status(self) -> dict[str, int]:
        """What the status route says of the window: steps live and packed, their bytes, the steps
        let go before their time (``unkept_steps``) and the writes to its file that failed."""
        failed = self.file.failed if self.file is not None else 0
        return {
            "live": len(self.hot),
            "packed": len(self.packed),
            "bytes": self.bytes,
            "unkept_steps": self.unkept,
            "file_failures": failed,
        }

    def __contains__(self, step: int) -> bool:
        return step in self.hot or step in self.packed

    def _forget(self, step: int) -> None:
        packed = self.packed.pop(step, None)
        if packed is not None:
            self._release(len(packed[1]))

    def _store(self, step: int, finalized: float, blob: bytes) -> None:
        """Pack ``step`` within the run's bytes and the sink's (the oldest go first), or count it unkept."""
        n = len(blob)
        if n > self.max_bytes:
            self.unkept += 1
            return
        while self.bytes + n > self.max_bytes:
            self._drop_oldest()
        while not self._hold(n):
            if not self.packed:
                self.unkept += 1
                return
            self._drop_oldest()
        last = next(reversed(self.packed.values()), None)
        self.packed[step] = (finalized, blob)
        self.bytes += n
        if last is not None and finalized < last[0]:  # a step kept again after its late update: in its place
            self.packed = OrderedDict(sorted(self.packed.items(), key=lambda item: item[1][0]))

    def _compact(self, now: float) -> None:
        """The file rewritten with what is kept once it holds more than twice that (``KeptFile``)."""
        if self.file is None or not self.file.worth_rewriting(self.bytes + sum(map(len, self._blobs.values()))):
            return
        wall = self._wall() - now
        records = [(step, finalized + wall, blob) for step, (finalized, blob) in self.packed.items()]
        records += [(step, self.hot[step].finalized + wall, blob) for step, blob in self._blobs.items()]
        self.file.rewrite(records)

    def _drop_oldest(self) -> None:
        _, (_, oldest) = self.packed.popitem(last=False)
        self._release(len(oldest))
        self.unkept += 1

    def _hold(self, n: int) -> bool:
        return self.retention is None or self.retention.take(n)

    def _release(self, n: int) -> None:
        """``n`` bytes of packed steps gone (``self.bytes`` counts only what is packed)."""
        self.bytes -= n
        if self.retention is not None:
            self.retention.give(n)


def _packed(step: Step) -> bytes:
    """What is kept of a finalized step: its states, who is still missing, who was in its views (by
    id), what it merged last; not its sample tables (``Step.tables``)."""
    state = Step(step.step, step.opened, merged=step.merged, viewed=step.viewed, late_points=step.late_points)
    state.missing, state.finalized, state.seq = step.missing, step.finalized, step.seq
    return zlib.compress(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), 1)
