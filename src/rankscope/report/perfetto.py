"""Spans → Perfetto / Chrome trace-event JSON, streamed: a Gantt of every rank per step without Jaeger.

Input rows are the JSONL span form the sink serves (``GET /rankscope/v1/spans``), one span
per line. Output (https://ui.perfetto.dev, chrome://tracing): one process track per rank
(``process_name`` metadata; pids numbered in rank order within each role and replica, in the
order roles first appear: ``group × 1,000,000 + rank + 1``, so the tracks sort by rank), a CPU thread and a GPU thread
(``timer="gpu"`` spans, CUDA-event times), complete ``X`` events in microseconds, instant
events for zero-length spans (``record_event``), flow arrows from a caller's span to
the spans a Monarch endpoint call made in another process, and flow arrows along OTel span
links (``rs.rl.consume``: from each generation span to the trainer step that trained on it).
A collective's span the sink matched across ranks carries how long this rank waited for the last
one (``rankscope.comm.wait_s``, an arg like every attribute); on the rank that arrived last
(``rankscope.comm.arrived_last``) an instant event ``last arrival: trainer_r1`` marks its start,
so the straggler is named where the others' waits begin.

Events are written as they are read; memory holds the process table and, for links, where
the last ``_LINKED_SPANS`` spans were (a link to an older span is drawn from nowhere: skipped),
so a 1,000-rank run streams through.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..core import names as attr

_THREADS = {"cpu": (1, "cpu"), "gpu": (2, "gpu (CUDA events)")}
_RANK_IN_LABEL = re.compile(r"_r(\d+)$")
_GROUP_PIDS = 1_000_000
_LINKED_SPANS = 200_000


@dataclass
class Filter:
    first: int | None = None
    last: int | None = None
    ranks: set[int] | None = None

    def keeps(self, row: dict[str, Any]) -> bool:
        step = row.get("step")
        if self.first is not None and (step is None or step < self.first):
            return False
        if self.last is not None and (step is None or step > self.last):
            return False
        return self.ranks is None or row.get("rank") in self.ranks


@dataclass
class _Tracks:
    """Process label → pid, and which (pid, tid) tracks were named already."""

    pids: dict[str, int] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)
    groups: dict[tuple[Any, Any], int] = field(default_factory=dict)
    threads: set[tuple[int, int]] = field(default_factory=set)


class TraceEventWriter:
    """Writes a ``{"traceEvents": [...]}`` document one event at a time."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._first = True
        self._tracks = _Tracks()
        self._flows = 0
        self.spans = 0
        self.links = 0
        self._where: OrderedDict[str, tuple[int, int, float]] = OrderedDict()
        """span id -> (pid, tid, start) of recent spans: where a link's arrow starts."""
        self._waiting: dict[str, list[tuple[int, int, float]]] = {}
        """Links to spans not read yet: (pid, tid, start) of the linking span, by linked span id."""
        out.write('{"displayTimeUnit":"ms","traceEvents":[\n')

    def _event(self, event: dict[str, Any]) -> None:
        self._out.write(("" if self._first else ",\n") + json.dumps(event, separators=(",", ":")))
        self._first = False

    def _pid(self, label: str, rank: int | None, role: Any = None, replica: Any = None) -> int:
        tracks = self._tracks
        pid = tracks.pids.get(label)
        if pid is None:
            if rank is None:
                found = _RANK_IN_LABEL.search(label)
                rank = int(found.group(1)) if found else 0
                role = role if role is not None else (label[: found.start()] if found else label)
            group = tracks.groups.setdefault((role, replica), len(tracks.groups))
            pid = group * _GROUP_PIDS + int(rank) % _GROUP_PIDS + 1
            if pid in tracks.taken:  # two processes in one slot (a restart, a duplicate rank): after the rest
                pid = _GROUP_PIDS * 1000 + len(tracks.pids)
            tracks.pids[label] = pid
            tracks.taken.add(pid)
            self._event({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
            self._event({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        return pid

    def _tid(self, pid: int, kind: str) -> int:
        tid, name = _THREADS[kind]
        if (pid, tid) not in self._tracks.threads:
            self._tracks.threads.add((pid, tid))
            self._event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        return tid

    def span(self, row: dict[str, Any]) -> None:
        attributes = row.get("attributes") or {}
        label = str(row.get("process") or f"{row.get('role')}_r{row.get('rank')}")
        pid = self._pid(label, row.get("rank"), row.get("role"), row.get("replica"))
        tid = self._tid(pid, "gpu" if attributes.get(attr.TIMER) == "gpu" else "cpu")
        ts = row["start_ns"] / 1e3
        dur = row["end_ns"] / 1e3 - ts  # from rounded ends, so ts + dur lands exactly where children end
        args = {"step": row.get("step"), "span_id": row.get("span_id"), "trace_id": row.get("trace_id"), **attributes}
        if row.get("error"):
            args["error"] = row["error"]
        event: dict[str, Any] = {"name": row["name"], "cat": row.get("role") or "span", "pid": pid, "tid": tid}
        if dur > 0:
            event.update(ph="X", ts=ts, dur=dur, args=args)
        else:
            event.update(ph="i", s="t", ts=ts, args=args)
        self._event(event)
        self.spans += 1
        if attributes.get(attr.COMM_LAST) is True:  # the sink's judgement: the others waited for this rank
            mark = {"op": attributes.get(attr.COMM_OP), "step": row.get("step"), "span_id": row.get("span_id")}
            self._event(
                {"name": f"last arrival: {label}", "cat": "straggler", "ph": "i", "s": "t"}
                | {"pid": pid, "tid": tid, "ts": ts, "args": mark}
            )
        self._link(row, pid, tid, ts)
        caller = attributes.get(attr.CALLER)
        if isinstance(caller, str) and caller != label:  # a Monarch call from another process: an arrow
            self._flows += 1
            source = self._pid(caller, None)
            self._tid(source, "cpu")
            flow = {"name": "call", "cat": "monarch", "id": self._flows}
            self._event({**flow, "ph": "s", "pid": source, "tid": 1, "ts": ts})
            self._event({**flow, "ph": "f", "bp": "e", "pid": pid, "tid": tid, "ts": ts})

    def _link(self, row: dict[str, Any], pid: int, tid: int, ts: float) -> None:
        """Arrows from linked spans to this one, and to this one from spans that linked it earlier."""
        span_id = str(row.get("span_id") or "")
        if span_id:
            self._where[span_id] = (pid, tid, ts)
            if len(self._where) > _LINKED_SPANS:
                self._where.popitem(last=False)
            for target in self._waiting.pop(span_id, ()):
                self._arrow((pid, tid, ts), target)
        for link in row.get("links") or ():
            linked = str(link.get("span_id") or "") if isinstance(link, dict) else ""
            source = self._where.get(linked)
            if source is not None:
                self._arrow(source, (pid, tid, ts))
            elif linked and len(self._waiting) < _LINKED_SPANS:
                self._waiting.setdefault(linked, []).append((pid, tid, ts))

    def _arrow(self, source: tuple[int, int, float], target: tuple[int, int, float]) -> None:
        self._flows += 1
        self.links += 1
        flow = {"name": "link", "cat": "lineage", "id": self._flows}
        self._event({**flow, "ph": "s", "pid": source[0], "tid": source[1], "ts": source[2]})
        self._event({**flow, "ph": "f", "bp": "e", "pid": target[0], "tid": target[1], "ts": target[2]})

    def close(self) -> None:
        self._out.write("\n]}\n")

    @property
    def processes(self) -> int:
        return len(self._tracks.pids)


def read_jsonl(paths: Iterable[str | Path]) -> Iterator[dict[str, Any]]:
    """Span rows from JSONL files (``.gz`` read as gzip); a bad line raises naming file and line."""
    for path in paths:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    yield _row(line, f"{path}:{number}")


def read_sink(url: str, experiment: str, keep: Filter, token: str | None = None) -> Iterator[dict[str, Any]]:
    """Span rows streamed from a sink's ``/rankscope/v1/spans`` route (filters applied there)."""
    query: dict[str, str] = {"experiment": experiment}
    if keep.first is not None:
        query["first"] = str(keep.first)
    if keep.last is not None:
        query["last"] = str(keep.last)
    if keep.ranks is not None:
        query["ranks"] = ",".join(str(r) for r in sorted(keep.ranks))
    request = urllib.request.Request(f"{url.rstrip('/')}/rankscope/v1/spans?{urllib.parse.urlencode(query)}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as response:
        for number, line in enumerate(io.TextIOWrapper(response, encoding="utf-8"), 1):
            if line.strip():
                yield _row(line, f"{url} line {number}")


def _row(line: str, where: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
        int(row["start_ns"]), int(row["end_ns"]), str(row["name"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: not a rankscope span row ({exc})") from None
    return row  # type: ignore[no-any-return]


def write(
    rows: Iterable[dict[str, Any]], output: str | Path, keep: Filter | None = None, gz: bool | None = None
) -> TraceEventWriter:
    """Write the rows that ``keep`` keeps to ``output`` (gzip when it ends in .gz or ``gz``)."""
    keep = keep or Filter()
    compress = str(output).endswith(".gz") if gz is None else gz
    opener: Any = gzip.open if compress else open
    with opener(output, "wt", encoding="utf-8") as handle:
        writer = TraceEventWriter(handle)
        for row in rows:
            if keep.keeps(row):
                writer.span(row)
        writer.close()
    return writer
