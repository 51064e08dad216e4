"""Disk as a budgeted resource: what each client's runs write, and a floor of free space.

A run's views write files (a report page is ~5 MB: plotly.js is inlined so that it opens
offline); a client opening runs could fill the disk. Two bounds (``DiskLimits``):

- per client (``per_client_bytes``; its token's scope, else its address, as the run quotas
  count): the bytes its runs' views wrote, measured at each view's location (its file, or its
  directory, walked up to ``WALK`` entries) when the run's views closed, plus a reservation for
  each of its runs still open (the most a run of it wrote so far, and at least what its views say
  a run costs: ``LoggerBackend.run_bytes``). A new run of a client past it is refused with the
  reason; its open runs go on (at most one page each past the budget).
- sink-wide (``min_free_bytes``): the free space of the file system the views write to, read at
  most once a second (``statvfs``); under the floor every new run is refused with the reason
  until space is freed (open runs go on: a write-ahead log that cannot write acknowledges
  nothing, and says so).

Measured locations are remembered (``MAX_LOCATIONS``, the oldest forgotten) so a file written by
two runs is counted once, for the client that wrote it first. What is charged is kept in memory:
a restarted sink starts from nothing (what it measures again as runs close).
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
from .runbook import RunKey

WALK = 10_000
"""Entries of a view's directory walked at most when it is measured."""
MAX_LOCATIONS = 100_000
"""Locations remembered (so a shared file is charged once)."""


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
    """Per client: bytes its closed runs' views wrote, and reservations for its open runs."""

    def __init__(self, limits: DiskLimits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits.resolved()
        self._clock = clock
        self._lock = threading.Lock()
        self._used: dict[str, int] = {}
        """Client -> bytes its closed runs' views wrote."""
        self._reserved: dict[RunKey, tuple[str, int]] = {}
        """Open run -> (its client, bytes reserved for it)."""
        self._reserved_by: dict[str, int] = {}
        """Client -> bytes reserved for its open runs."""
        self._per_run: dict[str, int] = {}
        """Client -> the most one of its runs wrote."""
        self._locations: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """Location measured -> (the client it is charged to, its bytes when last measured)."""
        self._free: tuple[float, int] | None = None
        """(clock time, free bytes) of the last ``statvfs``."""
        self.refused = {"client": 0, "floor": 0}

    def admit(self, key: RunKey, client: str, estimate: int) -> str | None:
        """Reserve a new run's bytes (at least ``estimate``), or why it may not open."""
        below = self.below_floor()
        if below is not None:
            with self._lock:
                self.refused["floor"] += 1
            return below
        limit = self.limits.per_client_bytes
        with self._lock:
            reserve = max(estimate, self._per_run.get(client, 0))
            if key in self._reserved:
                return None
            held = self._used.get(client, 0) + self._reserved_by.get(client, 0)
            if held + reserve > limit:
                self.refused["client"] += 1
                return (
                    f"this client's runs wrote {held >> 20} MiB of views (with those still open), and a run "
                    f"needs {reserve >> 20} MiB more: past its disk budget of {limit >> 20} MiB (limit per client)"
                )
            self._reserved[key] = (client, reserve)
            self._reserved_by[client] = self._reserved_by.get(client, 0) + reserve
        return None

    def settle(self, key: RunKey, client: str, locations: Iterable[str]) -> int:
        """A run's views closed: its reservation is replaced by what its locations hold now (a
        location charged once, to the first client measured there, by what it grew since it was
        last measured); returns the bytes charged."""
        with self._lock:
            self._unreserve(key)
            known = {where: self._locations.get(where) for where in locations if where}
        sizes = {w: size_of(w) for w, k in known.items() if k is None or k[0] == client}  # no lock: it reads the disk
        charged = 0
        with self._lock:
            for where, size in sizes.items():
                before = self._locations.pop(where, (client, 0))[1]
                self._locations[where] = (client, size)
                charged += size - before
            while len(self._locations) > MAX_LOCATIONS:
                self._locations.popitem(last=False)
            self._per_run[client] = max(self._per_run.get(client, 0), sum(sizes.values()))
            self._used[client] = self._used.get(client, 0) + charged
        return charged

    def forget(self, key: RunKey) -> None:
        """A run closed without views (nothing written): its reservation goes back."""
        with self._lock:
            self._unreserve(key)

    def _unreserve(self, key: RunKey) -> None:
        found = self._reserved.pop(key, None)
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
