"""Console backend: Forge's blocks on flush, one line per value when streaming.

Names and keys printed here may come from clients, and a terminal obeys what it is sent
(ANSI escapes, carriage returns, bidi overrides that reorder the line): every printed name
goes through ``printable``, which shows such characters escaped instead.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ..core import names as attr
from .base import LoggerBackend, LoggingMode, Metric


def format_value(value: float) -> str:
    """Numbers as Forge prints them; NaN and inf shown as ``nan``/``inf``, never hidden."""
    return repr(float(value))


def printable(text: object) -> str:
    """``text`` with control, format (bidi, zero-width), separator and unassigned characters escaped."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


_SHOWN_SEVERITIES = frozenset({"WARN", "WARNING", "ERROR", "FATAL", "CRITICAL"})


class ConsoleBackend(LoggerBackend):
    location = "stdout"

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        self.rank = kwargs.get("rank", 0)
        self.world_size = kwargs.get("world_size", 1)
        self.role = kwargs.get("role", "main")

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        global_view = self.logging_mode is LoggingMode.GLOBAL_REDUCE
        title = "GlobalReduce" if global_view else kwargs.get("process_name") or self.process_name or "process"
        step = "-" if global_step is None else global_step
        late = " (late update)" if kwargs.get("late") else ""
        lines = [f"=== [{printable(title)}] - METRICS STEP {step}{late} ==="]
        # The sink's housekeeping keys (rankscope/missing_processes ...) show only when non-zero.
        shown = [m for m in metrics if m.value or not m.key.startswith(attr.META_PREFIX)]
        labels = kwargs.get("labels") or {}  # the sink names who holds an extreme: "loss/argmax_rank: 3.0 (trainer_r3)"
        for m in shown:
            who = labels.get(m.key)
            lines.append(f"{printable(m.key)}: {format_value(m.value)}" + (f" ({printable(who)})" if who else ""))
        lines.append("===============")
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()

    def rewind(self, step: int) -> None:
        sys.stdout.write(
            f"=== rewound to step {step}: the steps from {step} come again and replace the ones above ===\n"
        )
        sys.stdout.flush()

    def log_record(self, record: dict[str, Any], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        """Warnings and worse only (a console is for people, not for every INFO line)."""
        if str(record.get("severity", "")).upper() in _SHOWN_SEVERITIES:
            who = kwargs.get("process_name", "?")
            sys.stdout.write(printable(f"[{who}] step {global_step} {record['severity']}: {record['body']}") + "\n")
            sys.stdout.flush()

    def log_samples(
        self, table: str, rows: list[dict[str, Any]], global_step: int | None, *args: Any, **kwargs: Any
    ) -> None:
        """A compact listing: one line per kept row, its end, who recorded it and its fields cut short."""
        late = " (late update)" if kwargs.get("late") else ""
        lines = [f"--- sample table {printable(table)} step {global_step}{late}: {len(rows)} rows ---"]
        for entry in rows:
            fields = ", ".join(f"{k}={_short(v)}" for k, v in entry["row"].items())
            version = entry.get("policy_version")
            lines.append(
                printable(
                    f"  {entry['side']:<6} {entry.get('process') or '?'}"
                    + (f" v{version}" if version is not None else "")
                    + f": {fields}"
                )[:240]
            )
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()

    def log_anomaly(self, record: dict[str, Any], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        sys.stdout.write(printable(f"!!! step {global_step} {describe(record)}") + "\n")
        sys.stdout.flush()

    def log_stream(self, metric: Metric, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(metric.timestamp or time.time()))
        rank = kwargs.get("rank", self.rank)  # the sink says whose value it is
        role = kwargs.get("process_name", self.role).rsplit("_r", 1)[0] if "process_name" in kwargs else self.role
        size = kwargs.get("world_size", self.world_size)
        who = printable(f"[{rank}] [{role}-{rank}/{size}]")
        sys.stdout.write(f"{who} {stamp} INFO {printable(metric.key)}: {format_value(metric.value)}\n")
        sys.stdout.flush()


def _short(value: object, limit: int = 40) -> str:
    text = repr(value) if isinstance(value, str) else format_value(value) if isinstance(value, float) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(record: dict[str, Any]) -> str:
    """One line for an anomaly record, for people."""
    kind, who = record.get("type"), record.get("process") or "?"
    if kind == "nonfinite":
        return f"non-finite value: {record.get('key')} from {who} ({record.get('count')} in the step)"
    if kind == "straggler":
        return f"straggler: {who} in {record.get('phase')} ({record.get('ratio')}x the median)"
    if kind == "slow_step":
        return f"slow step: {record.get('seconds', 0):.3f}s ({record.get('factor')}x the median)"
    if kind == "missing":
        return f"missing: {', '.join(map(str, record.get('processes', [])))}"
    if kind == "capture":
        return f"capture {record.get('capture')}: {who}: {record.get('path') or record.get('state')}"
    return str(record)
