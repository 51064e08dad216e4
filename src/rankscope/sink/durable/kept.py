"""A run's kept steps on disk, beside its write-ahead log: late data merges whole after a sink restart.

``book.retained`` keeps finalized steps' states so a late part is merged with what came in time.
In memory only, a sink killed during a node's outage would come back without them, and the
outage's late data would be partial. So each step kept (finalized, or its late update written) is
appended here, packed, as one record: ``length (u32) | crc32 (u32) | step (i64) | finalized (f64,
Unix seconds) | packed state``; reading takes the last record of each step and stops at a torn or
corrupt one (a SIGKILL mid-append). No fsync: the file survives the sink's crash, not the machine's
(the views were written; a machine crash makes the outage's late data partial, said as such).
Once the file holds more than twice what is kept (and 1 MiB), it is rewritten with what is kept
(a temporary file renamed over it). The packed bytes are the sink's own: it reads back what it wrote.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

KEPT = "kept.log"
"""The file's name in a run's write-ahead-log directory (removed with the run's other files)."""
KEPT_TMP = "kept.tmp"
"""Its rewrite, before it is renamed over it."""
_HEAD = struct.Struct("<IIqd")
SLACK = 1 << 20
"""Bytes the file may hold beyond twice what is kept before it is rewritten."""


class KeptFile:
    """One run's kept steps on disk (the module docstring). Not thread-safe: the run's lock guards it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = path.stat().st_size if path.exists() else 0
        self.failed = 0
        """Appends and rewrites that failed (a full disk, no descriptor): those steps are kept in memory only."""

    def read(self) -> dict[int, tuple[float, bytes]]:
        """Each step's last record: (when it was finalized, Unix seconds; its packed state)."""
        found: dict[int, tuple[float, bytes]] = {}
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return found
        offset = 0
        while offset + _HEAD.size <= len(data):
            length, crc, step, finalized = _HEAD.unpack_from(data, offset)
            blob = data[offset + _HEAD.size : offset + _HEAD.size + length]
            if len(blob) < length or zlib.crc32(blob) != crc:
                break  # torn by a crash mid-append, or corrupt: what follows is not trusted
            found[step] = (finalized, blob)
            offset += _HEAD.size + length
        return found

    def append(self, step: int, finalized: float, blob: bytes) -> None:
        self._write("ab", [(step, finalized, blob)])

    def rewrite(self, records: list[tuple[int, float, bytes]]) -> None:
        """The file holds exactly ``records`` (written beside it, renamed over it)."""
        tmp = self.path.with_name(KEPT_TMP)
        if self._write("wb", records, tmp):
            try:
                os.replace(tmp, self.path)
            except OSError:
                self.failed += 1

    def worth_rewriting(self, kept_bytes: int) -> bool:
        return self.size > 2 * kept_bytes + SLACK

    def clear(self) -> None:
        """A restarted run: its steps are executed again."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            self.failed += 1
        self.size = 0

    def _write(self, mode: str, records: list[tuple[int, float, bytes]], path: Path | None = None) -> bool:
        payload = b"".join(_HEAD.pack(len(b), zlib.crc32(b), s, f) + b for s, f, b in records)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
        try:
            with os.fdopen(os.open(path or self.path, flags, 0o600), mode) as out:  # the sink's own, as its log
                out.write(payload)
        except OSError:
            self.failed += 1
            return False
        self.size = len(payload) if mode == "wb" else self.size + len(payload)
        return True
