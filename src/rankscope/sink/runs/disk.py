"""Disk as a budgeted resource: what each client's runs write, and a floor of free space.

A run's views write files (a report page is ~5 MB: plotly.js is inlined so that it opens
offline); a client opening runs could fill the disk. Two bounds (``DiskLimits``):

- per client (``per_client_bytes``; its token's scope, else its address, as the run quotas
  count): what its runs' views hold on disk, measured at each view's location (its file, or its
  directory, walked up to ``WALK`` entries) when the run's views close, plus a reservation for
  each of its runs still open (the most one of its runs wrote so far, and at least what its views
  say a run costs: ``LoggerBackend.run_bytes``, a report page's 5 MiB). A new run of a client past
  it is refused with the reason; its open runs go on, what they write counted when they close.
  A client at its budget has its locations measured again (at most every ``REFRESH`` seconds),
  so files deleted meanwhile give their bytes back.
- sink-wide (``min_free_bytes``): the free space of the file system the views write to, read at
  most once a second (``statvfs``); under the floor every new run is refused with the reason
  until space is freed (open runs go on: a write-ahead log that cannot write acknowledges
  nothing, and says so).

A location is counted once, for the client whose run last grew it (a file two runs write is one
file). Measured locations are remembered (``MAX_LOCATIONS``; the oldest are forgotten, still
counted). What is counted is kept in memory: a restarted sink starts from nothing and measures
again as runs close. A reservation is held by one opening of a run (a ``Claim``), not by the run:
a run reopened while its closed views still write holds one of its own.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from ..config import DiskLimits

WALK = 10_000
"""Entries of a view's directory walked at most when it is measured."""
MAX_LOCATIONS = 100_000
"""Locations remembered (so a shared file is counted once); the oldest are forgotten, still counted."""
REFRESH = 10.0
"""Seconds between two measurements of a client's locations when it is at its budget."""


class Claim:
    """One opening of a run, as the budget knows it: what holds its reservation until its views
    are charged. Keyed by the run instead, a run reopened while its closed views still wrote shared
    their reservation, and lost it when they were charged."""

    __slots__ = ()


def size_of(location: str | os.PathLike[str]) -> int:
    """Bytes of a file, or of a directory's files (up to ``WALK`` entries); 0 if gone."""
    try:
        found = os.stat(location)
    except (OSError, ValueError):
        return 0
    if not os.path.isdir(location):
        return found.st_size
    total, seen = 0, 0
    for root, dirs, files in os.walk(location):
        for name in files:
            seen += 1
            if seen > WALK:
                return total
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
        seen += len(dirs)
    return total


class DiskBudget:
    """Per client: what its runs' views hold on disk, and reservations for its open runs."""

    def __init__(self, limits: DiskLimits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits.resolved()
        self._clock = clock
        self._lock = threading.Lock()
        self._used: dict[str, int] = {}
        """Client -> bytes of the locations it last grew (and of those forgotten since)."""
        self._reserved: dict[Claim, tuple[str, int]] = {}
        """An open run's claim -> (its client, bytes reserved for it)."""
        self._reserved_by: dict[str, int] = {}
        """Client -> bytes reserved for its open runs."""
        self._per_run: dict[str, int] = {}
        """Client -> the most one of its runs wrote (what its locations grew when it closed)."""
        self._locations: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """Location measured -> (the client whose run last grew it, its bytes when last measured)."""
        self._refreshed: dict[str, float] = {}
        """Client -> clock time its locations were last measured again (``REFRESH``)."""
        self._free: tuple[float, int] | None = None
        """(clock time, free bytes) of the last ``statvfs``."""
        self.refused = {"client": 0, "floor": 0}

    def admit(self, claim: Claim, client: str, estimate: int) -> str | None:
        """Reserve a new run's bytes (at least ``estimate``), or why it may not open. A client at
        its budget has its locations measured again first (at most every ``REFRESH`` seconds):
        what was deleted since is given back."""
        below = self.below_floor()
        if below is not None:
            with self._lock:
                self.refused["floor"] += 1
            return below
        refused = self._reserve(claim, client, estimate)
        if refused is not None and self._clock() - self._refreshed.get(client, -REFRESH) >= REFRESH:
            self._refresh(client)
            refused = self._reserve(claim, client, estimate)
        if refused is not None:
            with self._lock:
                self.refused["client"] += 1
        return refused

    def _reserve(self, claim: Claim, client: str, estimate: int) -> str | None:
        limit = self.limits.per_client_bytes
        with self._lock:
            if claim in self._reserved:
                return None
            reserve = max(estimate, self._per_run.get(client, 0))
            held = self._used.get(client, 0) + self._reserved_by.get(client, 0)
            if held + reserve > limit:
                return (
                    f"this client's runs' views hold {held >> 20} MiB (with those still open), and a run "
                    f"needs {reserve >> 20} MiB more: past its disk budget of {limit >> 20} MiB (limit per client)"
                )
            self._reserved[claim] = (client, reserve)
            self._reserved_by[client] = self._reserved_by.get(client, 0) + reserve
        return None

    def _refresh(self, client: str) -> None:
        """Measure the locations ``client`` last grew again (outside the lock: it reads the disk)."""
        with self._lock:
            self._refreshed[client] = self._clock()
            mine = [where for where, (owner, _) in self._locations.items() if owner == client]
        sizes = {where: size_of(where) for where in mine}
        with self._lock:
            for where, size in sizes.items():
                found = self._locations.get(where)
                if found is not None and found[0] == client:
                    self._measured(where, client, size)

    def settle(self, claim: Claim, client: str, locations: Iterable[str]) -> int:
        """A run's views closed: its reservation is replaced by what its locations hold now, each
        location counted once, for the client whose run last grew it; returns what it grew. Measured
        first (no lock: it reads the disk), then swapped in one step: never neither reserved nor counted."""
        sizes = {where: size_of(where) for where in locations if where}
        grew = 0
        with self._lock:
            self._unreserve(claim)
            for where, size in sizes.items():
                grew += size - self._measured(where, client, size)
            while len(self._locations) > MAX_LOCATIONS:  # forgotten, still counted
                self._locations.popitem(last=False)
            # what one run wrote, not what its locations hold: runs appending to one file each reserve
            # their part, not the file (10,000 runs into one JSONL file had reserved 6 MiB each)
            self._per_run[client] = max(self._per_run.get(client, 0), grew)
        return grew

    def _measured(self, where: str, client: str, size: int) -> int:
        """``where`` holds ``size`` bytes, counted for ``client``; returns what it held before."""
        owner, before = self._locations.pop(where, (client, 0))
        if size == before:  # not grown: still the last grower's
            client = owner
        self._used[owner] = self._used.get(owner, 0) - before
        self._used[client] = self._used.get(client, 0) + size
        self._locations[where] = (client, size)
        return before

    def forget(self, claim: Claim) -> None:
        """A run closed without views (nothing written), or refused after all: its reservation goes back."""
        with self._lock:
            self._unreserve(claim)

    def _unreserve(self, claim: Claim) -> None:
        found = self._reserved.pop(claim, None)
        if found is not None:
            client, reserved = found
            left = self._reserved_by.get(client, 0) - reserved
            if left > 0:
                self._reserved_by[client] = left
            else:
                self._reserved_by.pop(client, None)

    def below_floor(self) -> str | None:
        """Why nothing more may be written (the file system's free space under the floor), or None."""
        now = self._clock()
        found = self._free
        if found is None or now - found[0] >= 1.0:
            try:
                free = shutil.disk_usage(self.limits.where).free
            except OSError:
                return None  # the views' directory is gone: their own writes say so
            found = self._free = (now, free)
        floor = self.limits.min_free_bytes
        if found[1] >= floor:
            return None
        return f"the sink's disk has {found[1] >> 20} MiB free, under its floor of {floor >> 20} MiB; retry once freed"

    def status(self) -> dict[str, Any]:
        """The status route's ``disk``."""
        with self._lock:
            clients = sorted(self._used.items(), key=lambda kv: -kv[1])[:8]
            reserved = sum(self._reserved_by.values())
        free = self._free[1] if self._free is not None else None
        return {
            "per_client_bytes": self.limits.per_client_bytes,
            "min_free_bytes": self.limits.min_free_bytes,
            "free_bytes": free,
            "reserved_bytes": reserved,
            "most_used_bytes": clients[0][1] if clients else 0,
            "clients": len(self._used),
            "refused_runs": dict(self.refused),
        }
