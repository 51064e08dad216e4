"""What retired runs leave in the state directory: one bounded store, read whole on start.

A run that closes with nothing left to replay leaves no directory (``wal.ExperimentLog.remove``):
what must survive of it (``sink.runs.closed`` says what: the run book's record, where its steps
were, its last status) is put here first. So a start reads this store and the directories of the
runs that still have unwritten records, never the sink's whole history.

The store is two files at the top of the state directory (no ``safe_component`` starts with a dot):

- ``.retired``, the snapshot: one JSON line ``[table, key, value]`` per entry, written whole,
  fsynced and renamed over the last (``wal.atomic_write``'s way);
- ``.retired.log``, the journal: the lines put since, appended a batch at a time with one fsync per
  batch (``save``). A line a crash cut is skipped, and the next batch starts on a line of its own.

A later line for a (table, key) replaces the earlier one, and each table keeps its newest
``limits[table]`` keys. Once the journal holds more bytes than the snapshot (and at least
``COMPACT_BYTES``) the two are folded into a new snapshot and the journal is emptied: what a start
reads stays within twice the snapshot, whatever the history, and each entry is rewritten about
once per snapshot's worth of entries put after it. A crash between the rename and the emptying
folds the journal in twice: each key's last value, and the keys' order, are the same either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

from .wal import fsync_dir

log = logging.getLogger("rankscope.sink")

SNAPSHOT = ".retired"
JOURNAL = ".retired.log"
COMPACT_BYTES = 4 << 20
"""Journal bytes below which it is never folded into the snapshot."""

Tables = dict[str, OrderedDict[Hashable, Any]]


class RetiredStore:
    """A few bounded tables of JSON values by key, durable a batch at a time (the module docstring).

    ``put`` only queues a line (any thread); ``save`` makes the queued lines durable (one thread at a
    time: the closer's, or the sink's start and stop)."""

    def __init__(self, directory: Path, limits: Mapping[str, int], *, compact_bytes: int = COMPACT_BYTES) -> None:
        self.directory = Path(directory)
        self.limits = dict(limits)
        self.compact_bytes = compact_bytes
        self._pending: list[str] = []
        self._lock = threading.Lock()
        """Guards ``_pending``; ``_saving`` serializes the writes."""
        self._saving = threading.Lock()
        self._journal_bytes = 0
        self._snapshot_bytes = 0
        self._torn = False
        """The journal does not end in a newline: the next batch starts a line of its own."""
        self.saves = 0
        self.compactions = 0

    def load(self) -> Tables:
        """Every table's entries, oldest first (the snapshot, then the journal)."""
        with self._saving:
            tables: Tables = {name: OrderedDict() for name in self.limits}
            self._snapshot_bytes, _ = self._fold(self.directory / SNAPSHOT, tables)
            self._journal_bytes, self._torn = self._fold(self.directory / JOURNAL, tables)
            return tables

    def put(self, table: str, key: list[str], value: Any) -> None:
        """Queue an entry (``save`` makes it durable)."""
        line = json.dumps([table, key, value], separators=(",", ":"), default=str)
        with self._lock:
            self._pending.append(line)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def save(self) -> None:
        """Append the queued lines to the journal and fsync it (once for the batch); raises
        ``OSError`` (the lines stay queued) when the disk refuses."""
        with self._saving:
            with self._lock:
                lines, self._pending = self._pending, []
            if not lines:
                return
            text = ("\n" if self._torn else "") + "\n".join(lines) + "\n"
            try:
                self._append(text.encode())
            except OSError:
                with self._lock:  # kept for the next save, no more than the tables hold
                    self._pending[:0] = lines
                    del self._pending[: -sum(self.limits.values())]
                self._torn = True  # what did reach the file may end mid-line
                raise
            self._torn = False
            self._journal_bytes += len(text)
            self.saves += 1
            if self._journal_bytes >= max(self.compact_bytes, self._snapshot_bytes):
                try:
                    self._fold_in()
                except OSError as exc:  # the journal holds it all still: folded next time
                    log.error("rankscope sink: cannot fold %s into %s: %r", JOURNAL, SNAPSHOT, exc)

    def _append(self, data: bytes) -> None:
        path = self.directory / JOURNAL
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.directory)

    def compact(self) -> None:
        """Fold the journal into a new snapshot now, then empty the journal (``save`` does it when the
        journal outgrew the snapshot)."""
        with self._saving:
            self._fold_in()

    def _fold_in(self) -> None:
        """``compact``, under ``_saving``."""
        tables: Tables = {name: OrderedDict() for name in self.limits}
        self._fold(self.directory / SNAPSHOT, tables)
        self._fold(self.directory / JOURNAL, tables)
        lines = [
            json.dumps([name, list(key), value], separators=(",", ":"), default=str)
            for name, entries in tables.items()
            for key, value in entries.items()
            if isinstance(key, tuple)
        ]
        data = "".join(line + "\n" for line in lines).encode()
        tmp = self.directory / (SNAPSHOT + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / SNAPSHOT)
        fsync_dir(self.directory)
        with contextlib.suppress(FileNotFoundError):  # folded in: a crash before this folds it in again
            os.truncate(self.directory / JOURNAL, 0)
        self._snapshot_bytes, self._journal_bytes, self._torn = len(data), 0, False
        self.compactions += 1

    def _fold(self, path: Path, tables: Tables) -> tuple[int, bool]:
        """Apply a file's lines to ``tables``; (its size, whether it ends mid-line). A line that is not
        a whole entry (cut by a crash, or garbled) is skipped."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return 0, False
        except OSError as exc:
            log.error("rankscope sink: cannot read %s (%r); the runs it kept are forgotten", path, exc)
            return 0, False
        lines = data.splitlines()
        try:  # one parse for the whole file (a line that is not JSON: each line on its own)
            entries_read = json.loads(b"[" + b",".join(lines) + b"]") if lines else []
        except ValueError:
            entries_read = [_parsed(line) for line in lines]
        for entry in entries_read:
            try:
                name, key, value = entry
                entries = tables[name]
                key = tuple(key)
                hash(key)
            except (ValueError, TypeError, KeyError):
                continue
            entries.pop(key, None)
            entries[key] = value
            if len(entries) > self.limits[name]:
                entries.popitem(last=False)
        return len(data), bool(data) and not data.endswith(b"\n")


def _parsed(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None  # cut by a crash, or garbled: skipped
