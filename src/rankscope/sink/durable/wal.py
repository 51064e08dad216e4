"""Write-ahead log: what the sink acknowledged survives a crash (``rankscope sink --state-dir``).

Layout: ``STATE_DIR/.lock`` (one sink per directory; no ``safe_component`` starts with a dot), the
store of retired runs (``.retired``, ``.retired.log``: ``durable.retired``), and per run of an
experiment that has a log a directory
``safe_component(experiment id)/runs/safe_component(run id)`` (a run without an id: the
experiment's directory itself, as before runs) holding ``meta.json`` (the original ids and what the run book
keeps of the run, ``sink.runs.runbook``), ``checkpoint.json`` and segment files ``seg-<first seq>.log``.

A record is one process's checked points (and sample rows) of one step (``StepBook.apply`` resolves the
step first): a header (payload length, sequence number, step, CRC-32) and a marshalled
payload. The ingest path appends records, merges them, and before answering the client
waits until they are on disk; one syncer thread fsyncs every log with pending appends at
once, so concurrent requests share an fsync (group commit).

The views report each step they wrote with the newest record it covered; ``written.log``
gets one line per step as it is written (an append, no fsync: the views' own files are not
fsynced either; opened per line, so an idle run holds no descriptor for it), and the
checkpoint, taken at most every 0.1 s, folds those lines into
``written[step] = seq`` and empties the journal. A record (seq, step) is replayed on start
exactly when ``seq > written[step]``, so a SIGKILL at any moment loses no acknowledged point,
merges none twice, and a view writes each step once: only the step a view was writing when
the process died is written again (the window is that one step per run). A retried request
is recognized by its digest (also logged). A segment is deleted once every record in it is
covered. Caveat: a late update pending at the crash is written on start from the late
records alone (the step's earlier records are gone).

A run's log holds one descriptor, its current segment's, from its first append until it is
``release``d (the run went quiet, or another needs the descriptor: ``durable.descriptors``) or
closed; the next append opens the same segment again.

A run that closes with nothing left to replay (``covered``) leaves no directory: what must survive
of it goes to the state directory's store of retired runs (``durable.retired``), then its files are
removed (``remove``), ``meta.json`` first. A directory without ``meta.json`` holds no run: what a
removal cut short left in it is cleared when a log opens there, and by ``found`` on start.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import marshal
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import astuple
from pathlib import Path
from typing import Any

from ...core.paths import safe_component
from ...otlp.metrics import FIELDS, row_of
from .kept import KEPT, KEPT_TMP

log = logging.getLogger("rankscope.sink")

HEADER = struct.Struct("<IQqI")  # payload length, seq, step, crc32(seq, step, payload)
_MAX_RECORD = 64 * 1024 * 1024


JOURNAL = "written.log"
"""Per run: one line per step its views wrote since the last checkpoint."""
META = "meta.json"
_RUN_FILES = (META, "checkpoint.json", JOURNAL, "meta.tmp", "checkpoint.tmp", KEPT, KEPT_TMP)
"""A run's files besides its segments (``seg-*.log``); a segment set aside (``*.corrupt``) is the operator's."""


def _first_seq(segment: Path) -> int:
    """The seq of a segment's first record (its name: ``seg-<first seq>.log``)."""
    try:
        return int(segment.name[4:-4])
    except ValueError:
        return 0


def _torn(data: bytes, offset: int, seq: int) -> bool:
    """Whether the bad record at ``offset`` (its seq should be ``seq``) can be the append a crash
    cut: its length is one an append could write, and no intact record follows it (found by the
    next seq's bytes, then its checksum), since every record after it was acknowledged."""
    if offset + HEADER.size <= len(data) and HEADER.unpack_from(data, offset)[0] > _MAX_RECORD:
        return False
    needle = struct.pack("<Q", seq + 1)
    found = data.find(needle, offset + 1)
    while found != -1:
        start = found - 4  # the seq follows the 4-byte length
        if start > offset and start + HEADER.size <= len(data):
            length, next_seq, step, crc = HEADER.unpack_from(data, start)
            body = data[start + HEADER.size : start + HEADER.size + length]
            if len(body) == length and zlib.crc32(struct.pack("<Qq", next_seq, step) + body) == crc:
                return False
        found = data.find(needle, found + 1)
    return True


class StateDirBusyError(RuntimeError):
    """Another sink holds the state directory."""


class ExperimentLog:
    """One run's segments and checkpoint. ``append`` runs under the run's lock."""

    def __init__(
        self, directory: Path, experiment: str, segment_bytes: int, run: str = "", meta: dict[str, Any] | None = None
    ) -> None:
        self.directory = directory
        self.experiment = experiment
        self.run = run
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._segment: Path | None = None
        self._size = 0
        self.seq = 0
        self.durable = 0
        self.written: dict[int, int] = {}
        self.last_finalized = -1
        self.attempt = 0
        self._segments: dict[Path, dict[int, int]] = {}  # segment -> {step: newest seq in it}
        self._checkpointed = time.monotonic()  # a short run's steps are folded in once, as it closes
        self._closed = False
        self.set_aside: list[str] = []
        """Segments ``replay`` found corrupt before their end, renamed ``*.corrupt`` (what it says)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.fresh = not (directory / META).exists()
        """The directory held no run: a new run's, or one retired before. Its record (``meta``) is written first."""
        if self.fresh:
            _clear(directory, keep=True)  # what a removal cut short left: an earlier life's, never this one's
            atomic_write(directory / META, {**(meta or {}), "experiment": experiment, "run": run})
        self._load_checkpoint()

    def save_meta(self, meta: dict[str, Any], *, sync: bool = True) -> None:
        """What the run book keeps of the run (``runs.runbook.Run.record``), beside its records.
        ``sync=False``: replaced atomically but not fsynced (it survives the sink's crash, not the
        machine's: for what the sink can do without, such as whether the run finished). A closed
        log writes nothing: its directory may be gone (its run retired) or another log's."""
        with self._lock:
            if self._closed:
                return
            meta = {**meta, "experiment": self.experiment, "run": self.run}
            atomic_write(self.directory / META, meta, sync=sync)

    def _load_checkpoint(self) -> None:
        try:
            found = json.loads((self.directory / "checkpoint.json").read_text())
            self.written = {int(k): int(v) for k, v in found.get("written", {}).items()}
            self.last_finalized = int(found.get("last_finalized", -1))
            self.attempt = int(found.get("attempt", 0))
            self.seq = int(found.get("seq", 0))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.error("rankscope sink: unreadable checkpoint in %s (%r); replaying every record", self.directory, exc)
        self._read_journal()
        self.seq = max(self.seq, max(self.written.values(), default=0))  # closed without a checkpoint (``covered``)

    def _read_journal(self) -> None:
        """Fold in the steps the views wrote after the last checkpoint (a torn last line is skipped)."""
        try:
            lines = (self.directory / JOURNAL).read_bytes().splitlines()
        except OSError:
            return
        for line in lines:
            try:
                step, seq, last_finalized, attempt = map(int, line.split())
            except ValueError:
                continue
            self._note_written(step, seq, last_finalized, attempt)

    def replay(self) -> Iterator[tuple[int, int, bytes]]:
        """(seq, step, payload) of every record not yet covered by a written view, oldest first.

        A bad record at the very end of the newest segment is a torn tail (the crash cut an append
        that was never acknowledged): it is cut off. One anywhere else is corruption of
        acknowledged data: the records before it are replayed, and the segment is kept, renamed
        ``*.corrupt``, for the operator, never truncated; ``set_aside`` says so."""
        segments = sorted(self.directory.glob("seg-*.log"))
        for index, segment in enumerate(segments):
            steps = self._segments.setdefault(segment, {})
            try:
                data = segment.read_bytes()
            except OSError as exc:
                log.error("rankscope sink: cannot read %s: %r", segment, exc)
                continue
            offset = 0
            corrupt = False
            steps_seen: list[int] = []
            while offset + HEADER.size <= len(data):
                length, seq, step, crc = HEADER.unpack_from(data, offset)
                body = data[offset + HEADER.size : offset + HEADER.size + length]
                if len(body) != length or zlib.crc32(struct.pack("<Qq", seq, step) + body) != crc:
                    newest = index == len(segments) - 1
                    corrupt = not newest or not _torn(data, offset, _first_seq(segment) + len(steps_seen))
                    break
                offset += HEADER.size + length
                steps_seen.append(step)
                self.seq = max(self.seq, seq)
                steps[step] = max(steps.get(step, 0), seq)
                if seq > self.written.get(step, 0):
                    yield seq, step, body
            if corrupt:
                self._set_aside(segment, offset, len(data))
            elif offset < len(data):
                log.warning(
                    "rankscope sink: %s ends in a torn append (%d bytes, never acknowledged); cut off",
                    segment,
                    len(data) - offset,
                )
                with open(segment, "r+b") as f:  # drop the torn tail so the segment reads clean
                    f.truncate(offset)
        self.seq = max(self.seq, max(self.written.values(), default=0))  # no seq a set-aside record had
        self.durable = self.seq

    def _set_aside(self, segment: Path, offset: int, size: int) -> None:
        aside = segment.with_name(segment.name + ".corrupt")
        n = 0
        while aside.exists():  # a later segment may have the same name: keep every copy
            n += 1
            aside = segment.with_name(f"{segment.name}.corrupt.{n}")
        try:
            os.replace(segment, aside)
        except OSError as exc:
            log.error("rankscope sink: cannot set %s aside: %r", segment, exc)
            aside = segment
        self._segments.pop(segment, None)
        note = (
            f"write-ahead log of {self.experiment[:96]!r}: {segment.name} is corrupt at byte {offset} of {size}; "
            f"the records before it were replayed, the rest is kept unread in {aside.name}"
        )
        log.error("rankscope sink: %s", note)
        self.set_aside.append(note)

    def append(self, step: int, payload: bytes) -> int:
        with self._lock:
            if self._fd is None and self._segment is not None and self._size < self.segment_bytes:
                self._fd = os.open(self._segment, os.O_WRONLY | os.O_APPEND)  # released before: the same segment
            if self._fd is None or self._size >= self.segment_bytes:
                self._rotate()
            assert self._fd is not None and self._segment is not None
            self.seq += 1
            seq = self.seq
            head = HEADER.pack(len(payload), seq, step, zlib.crc32(struct.pack("<Qq", seq, step) + payload))
            os.write(self._fd, head + payload)
            self._size += len(head) + len(payload)
            steps = self._segments[self._segment]
            steps[step] = max(steps.get(step, 0), seq)
            return seq

    def _rotate(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self.durable = self.seq
        self._segment = self.directory / f"seg-{self.seq + 1:016d}.log"
        self._fd = os.open(self._segment, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._segments[self._segment] = {}
        self._size = 0
        fsync_dir(self.directory)

    def release(self, *, wait: bool = False) -> bool:
        """Close the segment's descriptor (the next append opens it again) if every record in it is
        durable; False when the log is in use or has records not yet synced. Never waits for the
        lock unless told to (``wait``: the run is closing; what is not synced yet is synced now)."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            if self._fd is not None:
                if self.durable < self.seq:
                    if not wait:
                        return False
                    os.fsync(self._fd)
                    self.durable = self.seq
                os.close(self._fd)
                self._fd = None
            return True
        finally:
            self._lock.release()

    def sync(self) -> None:
        """Make every appended record durable. The fsync runs on a duplicate of the segment's
        descriptor, outside the lock, so appends (the experiment's ingest) go on meanwhile."""
        with self._lock:
            target = self.seq
            if self._fd is None or self.durable >= target:
                self.durable = max(self.durable, target)
                return
            fd = os.dup(self._fd)  # a rotation may close the segment's own descriptor meanwhile
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:
            self.durable = max(self.durable, target)

    def written_view(self, step: int, seq: int, last_finalized: int, attempt: int, force: bool = False) -> None:
        """A view wrote ``step`` covering records up to ``seq``: journaled now, checkpointed at most every 0.1 s."""
        with self._lock:
            self._note_written(step, seq, last_finalized, attempt)
            if self._closed:  # a view that finished after the run's log closed (eviction, stop): replay covers it
                return
            try:
                journal = os.open(self.directory / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError as exc:  # out of descriptors: noted above, the next checkpoint holds it
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
            else:
                try:
                    os.write(journal, f"{step} {seq} {last_finalized} {attempt}\n".encode())
                finally:
                    os.close(journal)
            now = time.monotonic()
            if not force and now - self._checkpointed < 0.1:
                return
            self._checkpointed = now
            self._checkpoint()

    def _note_written(self, step: int, seq: int, last_finalized: int, attempt: int) -> None:
        """Idempotent, so a journal folded in twice (a crash between the checkpoint and the
        journal's truncation) changes nothing: an older attempt's step never moves the frontier."""
        if seq > self.written.get(step, 0):
            self.written[step] = seq
        if attempt > self.attempt:  # a restarted run: its steps went back
            self.attempt, self.last_finalized = attempt, last_finalized
        elif attempt == self.attempt:
            self.last_finalized = max(self.last_finalized, last_finalized)

    def _checkpoint(self) -> None:
        for segment, steps in list(self._segments.items()):
            if segment != self._segment and all(seq <= self.written.get(step, 0) for step, seq in steps.items()):
                with contextlib.suppress(OSError):
                    segment.unlink()
                del self._segments[segment]
        live = {step for steps in self._segments.values() for step in steps}
        self.written = {step: seq for step, seq in self.written.items() if step in live}
        state = {
            "written": {str(k): v for k, v in self.written.items()},
            "last_finalized": self.last_finalized,
            "attempt": self.attempt,
            "seq": self.seq,
        }
        atomic_write(self.directory / "checkpoint.json", state)
        with contextlib.suppress(FileNotFoundError):  # in the checkpoint now: a crash replays no line twice
            os.truncate(self.directory / JOURNAL, 0)

    def covered(self) -> bool:
        """Whether every record of this log is in a written view: nothing left to replay (a segment on
        disk this log never read, an earlier life's, counts as something)."""
        with self._lock:
            for steps in self._segments.values():
                if any(seq > self.written.get(step, 0) for step, seq in steps.items()):
                    return False
            try:
                return set(self.directory.glob("seg-*.log")) <= set(self._segments)
            except OSError:
                return False

    def close(self, *, checkpoint: bool = True) -> None:
        """Sync, checkpoint and close (once: a later call changes nothing, so a log closed twice never
        writes its checkpoint over that of a log opened on its directory since). Without ``checkpoint``
        (a ``covered`` log whose directory goes): no fsync for it; the journal still says what a log
        opened on the directory again needs."""
        with self._lock:
            if self._closed:
                return
            if self._fd is not None:
                if self.durable < self.seq:
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
                self.durable = self.seq
            self._segment = None
            if checkpoint:
                with contextlib.suppress(OSError):
                    self._checkpoint()
            self._closed = True

    def remove(self) -> None:
        """Delete a closed log's files (its run retired: what must survive of it is in the store of
        retired runs), ``meta.json`` first, so a crash midway leaves no run for a start to read, only
        files that are cleared; then its directory, and the experiment's when empty. The caller
        holds the registry's lock: no log opens on the directory meanwhile."""
        with self._lock:
            if not self._closed:
                raise RuntimeError(f"{self.directory} is removed while its log is open")
            _clear(self.directory)
            if self.run:  # the run-less run's directory is the experiment's: it goes when empty
                _prune(self.directory.parent.parent)


class WriteAheadLog:
    """The sink's state directory: one ``ExperimentLog`` per experiment, one syncer thread."""

    def __init__(self, directory: Path, *, segment_bytes: int = 8 * 1024 * 1024) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.directory / ".lock", "a")  # noqa: SIM115 - held for the sink's life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            message = f"another rankscope sink uses {self.directory}; give this one its own --state-dir"
            raise StateDirBusyError(message) from None
        self._legacy_lock = None
        legacy = self.directory / "lock"  # what a sink before ``.lock`` holds: both, during an upgrade
        if legacy.is_file():
            self._legacy_lock = open(legacy, "a")  # noqa: SIM115 - held for the sink's life
            try:
                fcntl.flock(self._legacy_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self._legacy_lock.close()
                self._lock_file.close()
                message = f"an older rankscope sink uses {self.directory}; give this one its own --state-dir"
                raise StateDirBusyError(message) from None
        self.segment_bytes = segment_bytes
        self._cond = threading.Condition()
        self._pending: set[ExperimentLog] = set()
        self._stop = False
        self.fsyncs = 0

    def open(self, experiment: str, run: str = "", meta: dict[str, Any] | None = None) -> ExperimentLog:
        """The log of a run; ``meta``: its record, written when its directory has none (a new run, or
        one retired before)."""
        directory = self.directory / safe_component(experiment)
        if run:
            directory = directory / "runs" / safe_component(run)
        return ExperimentLog(directory, experiment, self.segment_bytes, run, meta)

    def found(self) -> list[tuple[dict[str, Any], int, float]]:
        """(meta, attempt, last written) of every run with a log in the directory, oldest first. A
        directory without ``meta.json`` (a removal cut short) is cleared, and goes when empty."""
        runs = []
        metas = []
        for experiment in _directories(self.directory):
            for directory in [*_directories(experiment / "runs"), experiment]:
                if (directory / META).is_file():
                    metas.append(directory / META)
                    continue
                try:
                    _clear(directory)
                except OSError as exc:  # left as it is: no start reads it
                    log.error("rankscope sink: cannot clear %s: %r", directory, exc)
            _prune(experiment)
        for meta in metas:
            try:
                found = json.loads(meta.read_text())
                if not isinstance(found, dict) or not isinstance(found["experiment"], str):
                    raise TypeError("not a run's meta.json")
                found["run"] = str(found.get("run") or "")
                checkpoint = meta.parent / "checkpoint.json"
                attempt = int(json.loads(checkpoint.read_text()).get("attempt", 0)) if checkpoint.exists() else 0
                seen = max((f.stat().st_mtime for f in meta.parent.iterdir() if f.is_file()), default=0.0)
                runs.append((found, attempt, seen))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("rankscope sink: skipping %s: %r", meta.parent, exc)
        return sorted(runs, key=lambda r: float(r[0].get("started", r[2])))

    def wait(self, logs: dict[ExperimentLog, int], timeout: float = 30.0) -> bool:
        """Block until each log is durable up to its seq (group commit with other requests)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            for item in logs:
                self._pending.add(item)
            self._cond.notify_all()
            while any(item.durable < seq for item, seq in logs.items()):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop:
                    return False
                self._cond.wait(left)
        return True

    def run_syncer(self) -> None:
        """The syncer thread's loop (started and supervised by the sink)."""
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if self._stop and not self._pending:
                    return
                pending, self._pending = self._pending, set()
            for item in pending:
                try:
                    item.sync()
                except OSError as exc:  # a full or failing disk: clients get no acknowledgement
                    log.error("rankscope sink: fsync of %s failed: %r", item.directory, exc)
                    continue
                self.fsyncs += 1
            with self._cond:
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def close(self) -> None:
        self.stop()
        for held in (self._lock_file, self._legacy_lock):
            if held is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(held, fcntl.LOCK_UN)
                held.close()


_RECORD_VERSION = 3


def encode_record(
    digest: bytes, resource: dict[str, Any], states: list[Any], markers: list[Any], samples: Sequence[Any] = ()
) -> bytes:
    """A record's payload: the checked rows (``checked.StateRows``), markers and sample rows
    (``otlp.samples.SampleRow``) of one step."""
    return marshal.dumps(
        (
            _RECORD_VERSION,
            digest,
            resource,
            [(s.reduce, s.step, s.keys, s.rows) for s in states],
            [m.record() for m in markers],
            [astuple(row) for row in samples],
        )
    )


def decode_record(payload: bytes) -> tuple[bytes, dict[str, Any], list[Any], list[Any], list[Any]]:
    """(digest, resource, [(reduce, step, keys, rows)], [(step, expected, driven[, time[, ranks[, start]]])],
    [sample row fields]) of a payload (``Marker.of_record`` reads a marker's tuple)."""
    record = marshal.loads(payload)
    if len(record) == 4:  # version 1 (before rows): one (key, reduce, step, state) per point
        digest, resource, points, markers = record
        grouped: dict[tuple[str, int], tuple[list[str], list[Any]]] = {}
        for key, reduce, step, state in points:
            keys, rows = grouped.setdefault((reduce, step), ([], []))
            keys.append(key)
            rows.append(row_of(reduce, state) if reduce in FIELDS else (state,))
        return digest, resource, [(r, s, keys, rows) for (r, s), (keys, rows) in grouped.items()], markers, []
    if len(record) == 5:  # version 2 (before sample rows)
        _, digest, resource, states, markers = record
        return digest, resource, states, markers, []
    _, digest, resource, states, markers, samples = record
    return digest, resource, states, markers, samples


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/rankscope/sink`` (``~/.local/state/rankscope/sink``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rankscope" / "sink"


def atomic_write(path: Path, payload: dict[str, Any], *, sync: bool = True) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def _directories(path: Path) -> list[Path]:
    try:
        return [child for child in path.iterdir() if child.is_dir()]
    except OSError:
        return []


def _clear(directory: Path, *, keep: bool = False) -> None:
    """Remove a run's files from ``directory``, ``meta.json`` first (then no start reads it), then its
    segments, then its checkpoint and journal (never a segment without what covers it), and the
    directory itself unless ``keep`` or something else is in it (the run-less run's holds ``runs/``)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / META)
    try:
        segments = [p for p in directory.iterdir() if p.name.startswith("seg-") and p.name.endswith(".log")]
    except FileNotFoundError:
        return
    for path in [*segments, *(directory / name for name in _RUN_FILES[1:])]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if not keep:
        with contextlib.suppress(OSError):
            directory.rmdir()


def _prune(experiment: Path) -> None:
    """An experiment's ``runs/`` and its directory, each if empty."""
    for directory in (experiment / "runs", experiment):
        with contextlib.suppress(OSError):
            directory.rmdir()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
