"""Read a W&B run back from its ``run-*.wandb`` file (W&B >= 0.30 ships no reader).

The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then
32 KiB blocks of records, each ``crc32 (uint32) | length (uint16) | type (uint8) | payload``
with type 1 full, 2 first, 3 middle, 4 last; the payload is a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> Iterator[Any]:
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, hex(magic), version)
    offset, pending = HEADER, b""
    while offset + HEADER <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < HEADER:  # trailer padding
            offset += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        payload = data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        if kind == 0 and length == 0:
            break  # zero fill: end of what was written
        if kind in (1, 2):
            pending = payload
        else:
            pending += payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def run_files(root: Path, timeout: float = 20.0, killed: int = 0) -> list[Path]:
    """The run files under ``root``, once each is complete (its ``exit`` record written).

    ``run.finish()`` can return before W&B's writer process (wandb-core) has flushed the
    offline file, so a reader waits for the file rather than for the call. ``killed``: how many
    files a SIGKILLed writer left, which never get their ``exit`` record (waiting for those
    once cost a test the whole timeout).
    """
    deadline = time.monotonic() + timeout
    while True:
        paths = sorted(root.rglob("run-*.wandb"))
        if sum(map(_complete, paths)) >= max(1, len(paths) - killed) or time.monotonic() > deadline:
            return paths
        time.sleep(0.1)


def _complete(path: Path) -> bool:
    try:
        return any(r.WhichOneof("record_type") == "exit" for r in records(path))
    except (AssertionError, struct.error, OSError, DecodeError):  # still being written: a torn last record
        return False


def run_id(path: Path) -> str:
    return str(run_record(path).run_id)


def run_record(path: Path) -> Any:
    """The file's ``RunRecord`` (id, group, display name, config)."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run
    raise AssertionError(f"no run record in {path}")


def history(path: Path) -> list[dict[str, Any]]:
    """Every ``run.log`` row, decoded."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows


def by_step(paths: list[Path]) -> dict[int, dict[str, Any]]:
    """Rows keyed by rankscope's ``step`` metric, as docs/sink.md says to read them: later rows
    merged on top, a late update's ``late/`` values in place of the step's on-time ones."""
    found: dict[int, dict[str, Any]] = {}
    for path in paths:
        for row in history(path):
            if "step" in row:
                late = {k[len("late/") :]: v for k, v in row.items() if k.startswith("late/")}
                found.setdefault(int(row["step"]), {}).update(row, **late)
    return found


def wandb_tables(path: Path, table: str) -> dict[int, list[dict[str, Any]]]:
    """Each step's logged W&B Table ``table`` (rows as dicts), read back from the run's media files."""
    found: dict[int, list[dict[str, Any]]] = {}
    for row in history(path):
        if f"{table}/path" in row:  # W&B flattens the logged Table's reference
            assert row[f"{table}/_type"] == "table-file"
            media = next(path.parent.rglob(Path(row[f"{table}/path"]).name))
            data = json.loads(media.read_text())
            found[int(row["step"])] = [dict(zip(data["columns"], values, strict=True)) for values in data["data"]]
    return found
