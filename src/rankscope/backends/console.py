"""Console backend: a compact line per step for people, or Forge's per-key blocks.

Two formats (the view's ``format`` option, else ``RANKSCOPE_CONSOLE``; the Forge drop-in asks for
``full``):

* ``compact`` (the default): one line per step (wrapped to the terminal's width), the user's own
  keys first in a stable order (each keeps the place it took when first seen), 4 significant
  digits, then the step's time and its slowest process. rankscope's own keys (``rankscope/``,
  ``straggler/``, ``rl/``, what instrumentors record: ``metrics.catalog.key_kind``) and the
  traced phases' durations are left to the other views. Anomalies are one highlighted ``!!!``
  line per streak: a straggler that stays the straggler for ten steps is said once, when the
  sink names it, with its cause and its victims (``trainer_r2 in train/forward since step 3,
  +150.1ms (352.6x the others); arrived last at all_reduce, 3 others waited up to 150ms``). A
  non-finite value is said the same way, by the sink's detector or, for a process alone, by
  this view.
* ``full``: Forge's blocks, ``=== [GlobalReduce] - METRICS STEP N ===`` then ``key: value``
  for every key, as recorded, and one ``!!!`` line per anomaly.
* ``off``: nothing.

Names and keys printed here may come from clients, and a terminal obeys what it is sent
(ANSI escapes, carriage returns, bidi overrides that reorder the line): every printed name
goes through ``printable``, which shows such characters escaped instead.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import textwrap
import time
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import IO, Any

from ..core import names as attr
from ..core.anomalies import (
    Anomaly,
    Capture,
    Corrected,
    Interrupted,
    Missing,
    NonFinite,
    Outlier,
    Partial,
    SlowStep,
    Straggler,
)
from ..core.settings import resolve
from ..metrics.catalog import EXTREME_SUFFIXES, key_kind
from ..metrics.reduce import Reduce
from .base import LoggerBackend, LoggingMode, Metric, short_run

FORMATS = ("compact", "full", "off")
_DISTRIBUTION_PARTS = ("mean", "p50", "p90", "p99")
_MAX_STREAKS = 4096
_SHOWN_STEPS = 64
"""Steps whose shown values the compact console remembers (to leave out late updates that change none)."""
_TOTAL_MAX = "/total_duration_max_s"
"""A traced block's slowest total (``tracing.tracer``): the largest is the step's time."""
_LATE_RANK, _LATE_S = "/late_rank", "/late_s"
"""The sink's per-phase straggler keys (``straggler/{phase}/late_rank``, ``.../late_s``): the rank
whose time in the phase, net of collective waits, is furthest over the others' mean, and by how much."""
_COMM = f"{attr.STRAGGLER_PREFIX}comm/"
"""The sink's per-collective straggler keys (``straggler/comm/{op}/...``): arrivals, not a phase."""


def format_value(value: float) -> str:
    """Numbers as Forge prints them; NaN and inf shown as ``nan``/``inf``, never hidden."""
    return repr(float(value))


def short_value(value: float) -> str:
    """4 significant digits (``0.1871``, ``2.378``, ``1.235e+07``); whole numbers below a million
    whole (``1024``); NaN and inf as ``nan``/``inf``/``-inf``."""
    v = float(value)
    if not math.isfinite(v):
        return repr(v)
    if v.is_integer() and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.4g}"


def duration(seconds: float) -> str:
    """Seconds for people, 4 significant digits: ``1.234s``, ``412.3ms``, ``69.51us``."""
    if not math.isfinite(seconds) or abs(seconds) >= 1:
        return f"{short_value(seconds)}s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.4g}ms"
    return f"{seconds * 1e6:.4g}us"


def printable(text: object) -> str:
    """``text`` with control, format (bidi, zero-width), separator and unassigned characters escaped."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


ERASE_LINE = "\r\x1b[K"
"""A carriage return and ANSI's erase-in-line: the cursor back to the line's start, the line cleared."""


def fresh_line(stream: IO[str]) -> str:
    """What a line rankscope prints on a terminal starts with: ``ERASE_LINE``, so a progress bar
    drawn on the current line (tqdm's, on stderr, from this process or a rank under torchrun whose
    steps the sink prints) is cleared, not run into, and redrawn below at its next refresh, as
    ``tqdm.write`` does in-process. Nothing when the stream is not a terminal (a file, a pipe,
    Jupyter's) or the terminal is ``TERM=dumb``."""
    try:
        terminal = stream.isatty()
    except Exception:  # a stand-in without it (or whose own raises), or closed: never into the caller
        return ""
    return ERASE_LINE if terminal and os.environ.get("TERM") != "dumb" else ""


def write_line(stream: IO[str], text: str) -> None:
    """One of rankscope's lines on ``stream``, flushed, past a progress bar: where this process
    draws tqdm bars, ``tqdm.write``'s way (under tqdm's lock its bars are cleared, the line written,
    the bars redrawn, so neither runs into the other, nor is a bar's last frame cleared), and
    ``fresh_line`` first in any case (a bar of another process: a rank's, where a sink prints)."""
    line = fresh_line(stream) + text + "\n"
    bars = getattr(sys.modules.get("tqdm.std"), "tqdm", None)  # never imported here: only if the program did
    if bars is not None:
        try:
            mode = bars.external_write_mode(file=stream)
            mode.__enter__()
        except Exception:  # a tqdm without it, or a lock it could not make: the plain way
            mode = None
        if mode is not None:
            try:
                stream.write(line)
                stream.flush()
            finally:
                with contextlib.suppress(Exception):
                    mode.__exit__(None, None, None)
            return
    stream.write(line)
    stream.flush()


_SHOWN_SEVERITIES = frozenset({"WARN", "WARNING", "ERROR", "FATAL", "CRITICAL"})


class ConsoleBackend(LoggerBackend):
    location = "stdout"
    descriptors = 0

    def __init__(self, logger_backend_config: dict[str, Any] | None = None) -> None:
        super().__init__(logger_backend_config)
        chosen = self.logger_backend_config.get("format")
        if chosen is None:
            chosen = resolve("console")
        if chosen not in FORMATS:
            known = ", ".join(FORMATS)
            raise ValueError(f"ConsoleBackend: format {chosen!r} is not one of {known}")
        self.format: str = chosen
        self._order: dict[str, int] = {}
        """Each user key's place in the compact line, given when first seen: the order never changes."""
        self._streaks: dict[Hashable, int] = {}
        """An anomaly's streak (type and where) -> the last step it was seen in."""
        self._said_nonfinite: int | None = None
        """The step whose non-finite values a sink's detector already named (``log_anomaly``)."""
        self._shown: OrderedDict[tuple[str, int | None], list[str]] = OrderedDict()
        """The values each of the last steps' lines showed: a late update that shows the same is not printed."""
        self._cut_short: int | None = None
        """The step the job ended in (``interrupted``): its phases are partial, so no time is shown."""
        self._corrected: int | None = None
        """The step whose late update a ``corrected`` record just said (its value line is left out)."""
        self._corrections = CorrectedRuns()
        """How far each streak of ``corrected`` steps went: said once at its start, its extent when it ends."""
        # Highlights in color on a terminal (or with FORCE_COLOR), never with NO_COLOR (no-color.org).
        self._color = (sys.stdout.isatty() or bool(os.environ.get("FORCE_COLOR"))) and "NO_COLOR" not in os.environ
        self.rank, self.world_size, self.role = 0, 1, "main"
        self._run_label = ""
        """At a sink: ``[experiment · run] ``, said before each line while other runs print too."""

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        self.rank = kwargs.get("rank", 0)
        self.world_size = kwargs.get("world_size", 1)
        self.role = kwargs.get("role", "main")
        if self.role == "sink":  # one console per run at a sink: a shared sink prints several runs
            run = str(kwargs.get("run") or "")
            self._run_label = printable(f"[{kwargs.get('experiment') or '?'}{f' · {short_run(run)}' if run else ''}] ")
            _AT_SINK.add(self)

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.format == "off":
            return
        global_view = self.logging_mode is LoggingMode.GLOBAL_REDUCE
        title = "GlobalReduce" if global_view else kwargs.get("process_name") or self.process_name or "process"
        labels: Mapping[str, str] = kwargs.get("labels") or {}  # the sink names who holds an extreme
        if self.format == "full":
            self._write(_block(title, metrics, global_step, labels, bool(kwargs.get("late"))))
            return
        who = "" if global_view else f"[{printable(title)}] "
        lines = self._compact(who, metrics, global_step, labels, kwargs)
        if lines:
            self._write("\n".join(lines))

    def _compact(
        self, who: str, metrics: list[Metric], step: int | None, labels: Mapping[str, str], kwargs: dict[str, Any]
    ) -> list[str]:
        """The step's line (wrapped) and a highlighted line per non-finite key no detector named."""
        values, parts, step_time = _split(metrics, labels)
        seconds = kwargs.get("step_seconds")
        if step_time is None and isinstance(seconds, (int, float)):
            step_time = (float(seconds), None)
        judged = any(m.key.startswith(attr.STRAGGLER_PREFIX) for m in metrics)  # the sink's judgement, net of waits
        phase_times = kwargs.get("phase_times")
        held_up = _late(metrics, labels, phase_times) if judged else _holdup(phase_times)
        if step_time is not None and held_up is not None:
            step_time = (step_time[0], held_up)
        if step is not None and step == self._cut_short:
            step_time = None
        if not values and step_time is None:
            return []
        for key in values:  # new keys go last, in the order they came: the order they were first recorded in
            if key not in self._order:
                self._order[key] = len(self._order)
        items = [_item(key, values[key], parts.get(key), labels) for key in sorted(values, key=self._order.__getitem__)]
        shown = (who, step)
        corrected, self._corrected = self._corrected, None  # the record said just before this step's values
        if kwargs.get("late") and step is not None and step == corrected:
            return []  # late parts arrived: the ``corrected`` record says so, once per streak of steps
        if kwargs.get("late") and self._shown.get(shown) == items:
            return []  # a late update that changes nothing on the line (a final barrier's time)
        self._shown[shown] = list(items)
        while len(self._shown) > _SHOWN_STEPS:
            self._shown.popitem(last=False)
        if step_time is not None:
            slowest = f", slowest {step_time[1]}" if step_time[1] else ""
            items.append(f"| time {duration(step_time[0])}{slowest}")
        missing = kwargs.get("missing") or []
        if missing:
            more = f" +{len(missing) - 3}" if len(missing) > 3 else ""
            items.append(f"missing {printable(', '.join(map(str, missing[:3])))}{more}")
        late = " (late update)" if kwargs.get("late") else ""
        lines = _wrap(f"{who}step {'-' if step is None else step}{late}", items, _width())
        if self._said_nonfinite != step and not kwargs.get("late"):  # no detector named them: this view does
            for key, value in values.items():
                if not math.isfinite(value) and self._new_streak((NonFinite.KIND, who, key), step):
                    lines.append(self._alert(f"!!! step {step} non-finite value: {printable(key)} ({value})"))
        return lines

    def rewind(self, step: int) -> None:
        if self.format == "off":
            return
        self._streaks.clear()
        self._say_extents(self._corrections.ended())
        self._write(f"=== rewound to step {step}: the steps from {step} come again and replace the ones above ===")

    def log_record(self, record: dict[str, Any], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        """Warnings and worse only (a console is for people, not for every INFO line)."""
        if self.format != "off" and str(record.get("severity", "")).upper() in _SHOWN_SEVERITIES:
            who = kwargs.get("process_name", "?")
            self._write(printable(f"[{who}] step {global_step} {record['severity']}: {record['body']}"))

    def log_samples(
        self, table: str, rows: list[dict[str, Any]], global_step: int | None, *args: Any, **kwargs: Any
    ) -> None:
        """Full: one line per kept row, its end, who recorded it and its fields cut short.
        Compact: one line per table, its first row."""
        if self.format == "off":
            return
        late = " (late update)" if kwargs.get("late") else ""
        if self.format == "compact":
            first = rows[0]["row"] if rows else {}
            fields = ", ".join(f"{k}={_short(v, compact=True)}" for k, v in first.items())
            line = f"  table {table} step {global_step}{late}: {len(rows)} rows" + (f"; first: {fields}" * bool(rows))
            self._write(printable(line)[: max(_width(), 60)])
            return
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
        self._write("\n".join(lines))

    def log_anomaly(self, record: Anomaly, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.format == "off":
            return
        if self.format == "full":
            self._write(printable(f"!!! step {global_step} {describe(record)}"))
            return
        if isinstance(record, NonFinite):
            self._said_nonfinite = global_step
        if isinstance(record, Interrupted):
            self._cut_short = global_step
        if isinstance(record, Corrected):
            self._corrected = global_step  # its late update's line is this record's, once per streak
            self._say_extents(self._corrections.seen(record, global_step))
        since = record.first_step if isinstance(record, Straggler | Outlier) else global_step  # a sink's: said once
        if isinstance(record, Capture) or self._new_streak(record.streak, since):
            text = printable(f"!!! step {global_step} {describe(record)}")
            lines = textwrap.wrap(text, _width(), subsequent_indent="    ", break_on_hyphens=False) or [text]
            self._write("\n".join(self._alert(line) for line in lines))

    def log_stream(self, metric: Metric, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.format == "off":
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(metric.timestamp or time.time()))
        rank = kwargs.get("rank", self.rank)  # the sink says whose value it is
        role = kwargs.get("process_name", self.role).rsplit("_r", 1)[0] if "process_name" in kwargs else self.role
        size = kwargs.get("world_size", self.world_size)
        who = printable(f"[{rank}] [{role}-{rank}/{size}]")
        value = format_value(metric.value) if self.format == "full" else short_value(metric.value)
        self._write(f"{who} {stamp} INFO {printable(metric.key)}: {value}")

    def finish(self) -> None:
        self._say_extents(self._corrections.ended())
        _AT_SINK.discard(self)

    def _say_extents(self, lines: list[str]) -> None:
        if lines and self.format != "off":
            self._write("\n".join(self._alert(printable(line)) for line in lines))

    def _new_streak(self, key: Hashable, step: int | None) -> bool:
        """Whether ``key`` starts a streak at ``step`` (it was not seen at the step before, nor at this one)."""
        last = self._streaks.get(key)
        if step is None:
            return last is None
        if len(self._streaks) > _MAX_STREAKS:  # bounded: streaks that ended long ago are forgotten
            self._streaks = {k: s for k, s in self._streaks.items() if s >= step - 1}
        self._streaks[key] = step if last is None else max(last, step)
        return last is None or not 0 <= step - last <= 1

    def _alert(self, line: str) -> str:
        return f"\x1b[1;31m{line}\x1b[0m" if self._color else line  # bold red: read on dark and light terminals

    def _write(self, text: str) -> None:
        if self._run_label and _runs_printing() > 1:  # several runs print here: each line says whose
            text = "\n".join(self._run_label + line for line in text.split("\n"))
        write_line(sys.stdout, text)


_AT_SINK: weakref.WeakSet[ConsoleBackend] = weakref.WeakSet()
"""The consoles of the runs a sink in this process has open (their lines share its stdout); a run
may have several (its global view and its per-rank one)."""


def _runs_printing() -> int:
    """How many runs' consoles are open at this process's sink."""
    return len({console._run_label for console in list(_AT_SINK)})


class CorrectedRuns:
    """Streaks of ``corrected`` steps (one group of late processes, consecutive steps): the console
    says a streak at its first step, and its extent once it ends (a gap, a rewind, the run's end),
    so a node back after an outage reads as ``steps 0-105 corrected`` rather than ``step 0``."""

    def __init__(self) -> None:
        self._runs: dict[Hashable, tuple[Corrected, int, int, int]] = {}
        """streak -> its first record, first and last step, and how many steps it corrected."""

    def seen(self, record: Corrected, step: int | None) -> list[str]:
        """``record`` at ``step``; the line of the streak it ends, if it starts a new one."""
        if step is None:
            return []
        key = record.streak
        run = self._runs.get(key)
        if run is not None and 0 <= step - run[2] <= 1:
            self._runs[key] = (run[0], run[1], step, run[3] + (step != run[2]))
            return []
        said = [] if run is None else self._extent(run)
        if len(self._runs) >= _MAX_STREAKS:  # bounded: the oldest streak is said and forgotten
            said += self._extent(self._runs.pop(next(iter(self._runs))))
        self._runs[key] = (record, step, step, 1)
        return said

    def ended(self) -> list[str]:
        """Every streak's line, now that none goes on (a rewind, the run's end)."""
        said = [line for run in self._runs.values() for line in self._extent(run)]
        self._runs.clear()
        return said

    @staticmethod
    def _extent(run: tuple[Corrected, int, int, int]) -> list[str]:
        record, first, last, steps = run
        if steps < 2:
            return []  # its one line said it all
        who = _named(record.processes, record.count)
        return [f"!!! steps {first}-{last} corrected ({steps} steps): {who} arrived late, merged: the exact totals"]


def _split(
    metrics: list[Metric], labels: Mapping[str, str]
) -> tuple[dict[str, float], dict[str, dict[str, float]], tuple[float, str | None] | None]:
    """The user's values (a DISTRIBUTION key once, its parts aside) and the step's time with the
    process that took it: the largest traced total (``{block}/total_duration_max_s``)."""
    values: dict[str, float] = {}
    parts: dict[str, dict[str, float]] = {}
    step_time: tuple[float, str | None] | None = None
    for m in metrics:
        kind = key_kind(m.key)
        if kind == "phase":
            if m.key.endswith(_TOTAL_MAX) and (step_time is None or m.value > step_time[0]):
                holder = labels.get(f"{m.key}/argmax_rank")
                step_time = (m.value, None if holder is None else printable(holder))
        elif kind == "user" and not m.key.endswith(EXTREME_SUFFIXES):
            base, _, part = m.key.rpartition("/")
            if m.reduction is Reduce.DISTRIBUTION and part in _DISTRIBUTION_PARTS:
                parts.setdefault(base, {})[part] = m.value
                values.setdefault(base, m.value)
            else:
                values[m.key] = m.value
    return values, parts, step_time


def _late(metrics: list[Metric], labels: Mapping[str, str], phase_times: object) -> str | None:
    """Who held the step up, from the sink's straggler keys: the rank furthest over the others'
    mean in its phase, net of collective waits (``straggler/{phase}/late_s``), so the ranks that
    waited for it in a collective are not named (``trainer_r2 in train/forward +150.1ms``). Its
    label is the sink's (``labels``), else the process of that rank in the phase; None: no such key."""
    ranks: dict[str, float] = {}
    late: dict[str, float] = {}
    arrivals: dict[str, float] = {}
    """Per ``comm/{op}``: the last arrival's rank, for a step without traced phases."""
    for m in metrics:
        if not m.key.startswith(attr.STRAGGLER_PREFIX):
            continue
        name = m.key[len(attr.STRAGGLER_PREFIX) :]
        if name.endswith(_LATE_RANK):
            (arrivals if m.key.startswith(_COMM) else ranks)[name[: -len(_LATE_RANK)]] = m.value
        elif name.endswith(_LATE_S) and math.isfinite(m.value):
            late[name[: -len(_LATE_S)]] = m.value
    phase = max((p for p in late if p in ranks), key=late.__getitem__, default=None)
    if phase is None or late[phase] <= 0:
        return _arrived_last(arrivals, late, labels)
    while True:  # the phase inside it that holds most of it: train/forward rather than train
        inside = [p for p in late if p in ranks and p.startswith(phase + "/") and late[p] >= 0.8 * late[phase]]
        if not inside:
            break
        phase = max(inside, key=late.__getitem__)
    rank = ranks[phase]
    label = labels.get(f"{attr.STRAGGLER_PREFIX}{phase}{_LATE_RANK}")
    by_process = phase_times.get(phase) if isinstance(phase_times, Mapping) else None
    if label is None and isinstance(by_process, Mapping):
        label = next((getattr(p, "label", None) for p in by_process if getattr(p, "rank", None) == rank), None)
    who = printable(label) if label is not None else f"rank {short_value(rank)}"
    return f"{who} in {printable(phase)} +{duration(late[phase])}"


def _arrived_last(arrivals: Mapping[str, float], late: Mapping[str, float], labels: Mapping[str, str]) -> str | None:
    """Without traced phases: the rank that arrived last at the collective it was latest at
    (``trainer_r2 late at comm/all_reduce +19.7ms``); the others only waited for it."""
    op = max((o for o in arrivals if late.get(o, 0.0) > 0), key=late.__getitem__, default=None)
    if op is None:
        return None
    label = labels.get(f"{attr.STRAGGLER_PREFIX}{op}{_LATE_RANK}")
    who = printable(label) if label is not None else f"rank {short_value(arrivals[op])}"
    return f"{who} late at {printable(op)} +{duration(late[op])}"


def _holdup(phase_times: object) -> str | None:
    """Who held the step up without the sink's straggler keys, from its seconds per phase per
    process: the process furthest over the others' mean in its phase (``trainer_r2 in
    train/forward +150.2ms``); None without two processes. A collective's time is a wait, not a
    phase: the rank that waited longest in it held nobody up."""
    if not isinstance(phase_times, Mapping):
        return None
    found: tuple[float, str] | None = None
    for phase, by_process in phase_times.items():
        if not isinstance(by_process, Mapping) or len(by_process) < 2 or str(phase).startswith("comm/"):
            continue
        total = sum(by_process.values())
        process, high = max(by_process.items(), key=lambda kv: kv[1])
        over = high - (total - high) / (len(by_process) - 1)
        if found is None or over > found[0]:
            label = getattr(process, "label", process)
            found = (over, f"{printable(label)} in {printable(phase)} +{duration(over)}")
    return None if found is None else found[1]


def _item(key: str, value: float, parts: dict[str, float] | None, labels: Mapping[str, str]) -> str:
    """``loss 0.1871``, ``grad_norm 2.378 (trainer_r0)`` (who holds a MAX/MIN), or a DISTRIBUTION's
    ``tokens 92.88 (p50 39.1 p90 182 p99 182)``."""
    if parts is not None:
        spread = " ".join(f"{p} {short_value(parts[p])}" for p in _DISTRIBUTION_PARTS[1:] if p in parts)
        text = f"{printable(key)} {short_value(parts.get('mean', value))}"
        return f"{text} ({spread})" if spread else text
    holder = labels.get(f"{key}/argmax_rank") or labels.get(f"{key}/argmin_rank")
    return f"{printable(key)} {short_value(value)}" + (f" ({printable(holder)})" if holder else "")


def _block(title: str, metrics: list[Metric], step: int | None, labels: Mapping[str, str], late: bool) -> str:
    """Forge's block: every key as recorded; the sink's housekeeping keys only when non-zero."""
    head = f"{'-' if step is None else step}{' (late update)' if late else ''}"
    lines = [f"=== [{printable(title)}] - METRICS STEP {head} ==="]
    for m in metrics:
        if m.value or not m.key.startswith(attr.META_PREFIX):
            who = labels.get(m.key)  # "loss/argmax_rank: 3.0 (trainer_r3)"
            lines.append(f"{printable(m.key)}: {format_value(m.value)}" + (f" ({printable(who)})" if who else ""))
    lines.append("===============")
    return "\n".join(lines)


def _width() -> int:
    """The terminal's width (``COLUMNS``), 120 when the output is not a terminal; at least 60."""
    return max(60, shutil.get_terminal_size((120, 24)).columns)


def _wrap(head: str, items: list[str], width: int) -> list[str]:
    """``head`` then the items two spaces apart, continued on lines indented under the first item."""
    indent = " " * min(len(head) + 2, 24)
    lines, line = [], head
    for item in items:
        if line != head and len(line) + 2 + len(item) > width:
            lines.append(line)
            line = indent + item
        else:
            line = f"{line}  {item}"
    lines.append(line)
    return lines


def _short(value: object, limit: int = 40, compact: bool = False) -> str:
    if isinstance(value, str):
        text = repr(value)
    elif isinstance(value, float):
        text = short_value(value) if compact else format_value(value)
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ratio(value: object) -> str:
    return short_value(value) if isinstance(value, (int, float)) else str(value)


def describe(record: Anomaly) -> str:
    """One line for an anomaly record, for people."""
    match record:
        case NonFinite():
            return f"non-finite value: {record.key} from {record.process or '?'} ({record.count} in the step)"
        case Straggler():
            since = f" since step {record.first_step}" if record.last_step > record.first_step else ""
            where = straggler_where(record.phase)
            return f"straggler: {record.process or '?'}{where}{since}{straggler_details(record)}"
        case Outlier():
            return f"outlier: {record.process or '?'} {outlier_details(record)} since step {record.first_step}"
        case SlowStep():
            return f"slow step: {record.seconds:.3f}s ({_ratio(record.factor)}x the median)"
        case Missing():
            return f"missing: {', '.join(record.processes)}"
        case Interrupted() if record.failed:
            others = [p for p in record.processes if p not in record.failed]
            waiting = f"; {', '.join(others)} had not closed it" if others else ""
            pairs = zip(record.failed, record.errors, strict=False)
            raised = (f"{printable(p)} raised {printable(e)}" for p, e in pairs)
            return f"failed: {'; '.join(raised)}{waiting}"
        case Interrupted():
            waiting = f" ({', '.join(record.processes)} had not)" if record.processes else ""
            return f"interrupted: the job ended before every process closed it{waiting}"
        case Corrected():
            still = f"; {record.missing} still missing" if record.missing else ""
            return f"corrected: {_named(record.processes, record.count)} arrived late, merged: the exact total{still}"
        case Partial():
            who = _named(record.processes, record.count)
            return f"partial: {who} arrived after the step was let go; its values lack their {record.points} points"
        case Capture():
            return f"capture {record.capture}: {record.process or '?'}: {record.path}"
    return str(record.to_json())


def outlier_details(record: Outlier) -> str:
    """``loss 1.8 vs the others 1 ± 0.01 (+80σ)``: an outlier's key, its value and the others'
    (``rankscope top``'s words for a streak going on too)."""
    sigmas = record.sigmas
    far = "others all equal" if abs(sigmas) >= 1e9 else f"{'+' if sigmas >= 0 else '-'}{short_value(abs(sigmas))}σ"
    others = f"{short_value(record.others_mean)} ± {short_value(record.others_std)}"
    return f"{record.key} {short_value(record.value)} vs the others {others} ({far})"


def _named(processes: tuple[str, ...], count: int) -> str:
    """The processes a record names (the first of them, and how many more)."""
    more = count - len(processes)
    return ", ".join(processes) + (f" and {more} more" if more > 0 else "")


def straggler_where(phase: object) -> str:
    """`` in train/forward``: the phase a straggler's time went to ("" when the sink named none:
    it was late to a collective only)."""
    return f" in {phase}" if phase else ""


def straggler_details(record: Straggler) -> str:
    """What a straggler record says after who and where (``straggler: trainer_r2 in train/forward``):
    by how much, then its victims (``, +150.1ms (352.6x the others); arrived last at all_reduce, 3
    others waited up to 150ms``; where no collective span showed the wait, the phase the others
    waited in). Also ``rankscope top``'s words for a streak going on."""
    line = ""
    excess, waited, waiting = _seconds(record.excess_s), _seconds(record.waited_s_max), record.waiting
    if excess is not None:
        line += f", +{duration(excess)}"
    line += f" ({_ratio(record.ratio)}x the others)"
    victims = ""
    if waited is not None and waited > 0:
        others = f"{waiting} other{'s' * (waiting != 1)}" if isinstance(waiting, int) and waiting > 0 else "others"
        victims = f"{others} waited up to {duration(waited)}"
    if record.collective:
        return f"{line}; arrived last at {record.collective}" + (f", {victims}" * bool(victims))
    if record.sync_phase:  # no collective span: the shortest-sync rule found the others' wait
        return f"{line}; the others waited for it in {record.sync_phase} (collectives unseen)"
    return f"{line}; {victims}" if victims else line


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
