"""``rankscope top``: a live terminal view of a running sink, read over its HTTP routes.

    rankscope top [--sink http://127.0.0.1:4318] [--experiment ID [--run RUN]] [--keys loss,grad_norm]

Without ``--sink`` it watches the newest sink running on this machine (a ``rankscope run``'s or
an embedded one, which announce themselves: ``sink.embedded.discover``), and until one answers it
keeps looking: ``top`` may start before the job.

Every ``--interval`` seconds (default 1, at most 1) it reads ``/rankscope/v1/status`` and
``/rankscope/v1/recent`` and redraws: the experiments and their runs, the chosen run's last finalized step, its
lag and step rate, chosen keys with sparklines over the last steps, a rank x phase map of the
last step's span seconds (in each phase the process late net of its waits marked), the straggler streaks going on
(who held the others up, in which phase, since which step, by how much, and who waited for it at
which collective), missing processes, refused points, anomalies and captures. Plain text in any
terminal (rich), so it works over SSH; ``q`` quits (so does Ctrl-C).

Its states, one after the other (``Follow``):

* waiting for a sink: none answers yet (none announced on this machine, or ``--sink`` down);
* waiting for the first step of the experiment: the sink answers, no step is finalized yet
  (how many of the run's processes it has seen so far);
* live: the screen above, redrawn;
* run ended: every process of the run said goodbye (the status route says the run ended), or the
  sink that answered is gone (an embedded sink exits with its job). The last screen stays, marked,
  polling stops, and ``top`` exits ``ENDED_LINGER`` seconds later (``q`` sooner), leaving that
  screen on the terminal.

At any width keys and phases are cut in the middle (``shorten``), keeping their end, and distinct
ones stay distinct (``fit``). The default keys are the user's own first, then the traced phases',
then rankscope's own (``metrics.catalog.key_kind``). The step rate is steps per second of the
job's own wall time (each step's ``duration`` from the recent route: from the previous step's first
close to its own), never how fast the sink finalized them; ``-`` when unknown.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import select
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # rich loads when the view draws: every other command starts without it
    from rich.console import Console, ConsoleOptions, Group, RenderableType
    from rich.table import Table
    from rich.text import Text

from ..backends.console import outlier_details, printable, straggler_details, straggler_where
from ..core import names as attr
from ..core.anomalies import Anomaly, Outlier, Straggler, from_json
from ..metrics.catalog import EXTREME_SUFFIXES, key_kind
from .sink import DEFAULT_SINK, find_sink

SPARKS = "▁▂▃▄▅▆▇█"
MAX_ROWS = 16
MAX_PHASES = 8
DEFAULT_KEYS = 6
"""Keys charted without ``--keys``."""
KEY_ROOM = 16
"""Characters of a key the keys table keeps beside its numbers (else it drops the min and max)."""
RATE_STEPS = 10
"""Steps the step rate is taken over (the last ones)."""
ELLIPSIS = "…"
GONE_AFTER = 2
"""Polls in a row a sink that answered before leaves unanswered before it counts as gone."""
SETTLE_POLLS = 3
"""Polls at most after the run ended (the sink finalizes its last steps on the goodbyes), fewer
once the last step stays the same."""
ENDED_LINGER = 5.0
"""Seconds the ended screen stays before ``top`` exits (``q`` exits sooner)."""
_KIND_ORDER = {"user": 0, "phase": 1, "internal": 2}
_OVERHEAD = 3
"""Characters a boxed table's column takes besides its text: its padding and one border."""


# -- what fits --------------------------------------------------------------------------------


def sparkline(values: Iterable[float | None]) -> str:
    """One character per value: its height between the lowest and highest finite value; ``!`` a
    non-finite value, ``·`` a step without one."""
    values = list(values)
    finite = [v for v in values if v is not None and math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    span = high - low or 1.0

    def spark(v: float | None) -> str:
        if v is None:
            return "·"
        if not math.isfinite(v):
            return "!"
        return SPARKS[int((v - low) / span * (len(SPARKS) - 1))]

    return "".join(spark(v) for v in values)


def shorten(text: str, width: int, head: int | None = None) -> str:
    """``text`` in at most ``width`` characters, cut in the middle (``…``): ``head`` characters of
    its start (default: two fifths of what fits) and the rest from its end, where keys of one
    family differ (``comm/all…/duration_max_s``)."""
    if len(text) <= width:
        return text
    if width < 2:
        return ELLIPSIS[:width]
    keep = width - 1
    head = keep * 2 // 5 if head is None else max(0, min(head, keep))
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def fit(texts: Iterable[str], width: int) -> dict[str, str]:
    """Each of ``texts`` shortened to ``width`` (at least 6) characters, distinct texts still
    distinct: texts cut to one text are cut again elsewhere (the same cut for all of them, the
    nearest the usual one that tells them apart), else around where they first differ, else
    numbered (``~2``)."""
    width = max(width, 6)
    shown = {t: shorten(t, width) for t in dict.fromkeys(texts)}
    for group in _clashes(shown):
        others = set(shown.values()) - {shown[group[0]]}
        shown.update(_apart(group, width, others))
    tags = 1
    for _ in range(len(shown)):  # the last resort: each round tags at least one text uniquely
        clashing = _clashes(shown)
        if not clashing:
            break
        for group in clashing:
            for text in group[1:]:
                tags += 1
                tag = f"~{tags}"
                shown[text] = shorten(text, width - len(tag)) + tag
    return shown


def _clashes(shown: Mapping[str, str]) -> list[list[str]]:
    """The texts (more than one) that show as one."""
    by_shown: dict[str, list[str]] = {}
    for text, cut in shown.items():
        by_shown.setdefault(cut, []).append(text)
    return [group for group in by_shown.values() if len(group) > 1]


def _apart(group: list[str], width: int, others: set[str]) -> dict[str, str]:
    """``group``'s texts (shown as one) cut so that they differ, and differ from ``others``."""
    keep = width - 1
    usual = keep * 2 // 5
    for head in sorted(range(keep + 1), key=lambda h: (abs(h - usual), h)):
        cut = {t: shorten(t, width, head) for t in group}
        if len(set(cut.values())) == len(group) and not others & set(cut.values()):
            return cut
    first = min(_common(group[0], t) for t in group[1:])  # they differ only in the middle: show where
    return {t: _window(t, width, first) for t in group}


def _common(a: str, b: str) -> int:
    """How many first characters ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _window(text: str, width: int, at: int) -> str:
    """``…`` + ``width - 2`` characters of ``text`` from a little before ``at`` + ``…``."""
    if len(text) <= width:
        return text
    body = width - 2
    start = min(max(1, at - body // 3), len(text) - body - 1)
    return ELLIPSIS + text[start : start + body] + ELLIPSIS


def default_keys(recent: list[dict[str, Any]], n: int = DEFAULT_KEYS) -> list[str]:
    """The keys charted without ``--keys``: the user's own first, then the traced phases', then
    rankscope's own (``key_kind``), each in the sink's order (the last step's, then keys only
    earlier steps had); never the sink's views of the run (``rankscope/``, ``straggler/``) nor a MAX
    or MIN key's rank (``/argmax_rank``)."""
    seen: dict[str, None] = {}
    for row in reversed(recent):
        for key in row.get("values") or {}:
            views = isinstance(key, str) and key.startswith((attr.META_PREFIX, attr.STRAGGLER_PREFIX))
            if isinstance(key, str) and not views and not key.endswith(EXTREME_SUFFIXES):
                seen.setdefault(key)
    return sorted(seen, key=lambda k: _KIND_ORDER.get(key_kind(k), 2))[:n]


def step_rate(recent: list[dict[str, Any]]) -> float | None:
    """Steps per second of the job's wall time over the last ``RATE_STEPS`` steps: their count over
    their ``duration``s (the recent route's: from the previous step's first close to this one's);
    None when the sink gave none (a step without one, after a restart, is left out, and so is the
    first step, timed from the job's start: its set-up is not a step's pace)."""
    durations = (_number(r.get("duration")) for r in recent[-RATE_STEPS:] if r.get("from_start") is not True)
    seconds = [d for d in durations if d is not None and d > 0]
    return len(seconds) / sum(seconds) if seconds else None


def _number(value: Any) -> float | None:
    """A JSON number as a float (NaN and infinities too); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _show(value: Any) -> str:
    """A value from the sink as text, ``-`` for none (never ``None``)."""
    if value is None:
        return "-"
    number = _number(value)
    if number is not None and math.isfinite(number) and number == int(number):
        return str(int(number))
    return printable(value)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


# -- reading the sink -------------------------------------------------------------------------


def _get(url: str, path: str, query: dict[str, str], token: str | None) -> Any:
    full = f"{url.rstrip('/')}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request = urllib.request.Request(full, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=2.0) as response:
            return json.loads(response.read())
    except (OSError, ValueError, http.client.HTTPException):  # a sink gone mid-answer too
        return None


def snapshot(url: str, experiment: str | None, token: str | None = None, run: str | None = None) -> dict[str, Any]:
    """What one screen shows: the sink's experiments and their runs, and the chosen run's status
    and recent steps (run None: the experiment's latest), and ``ended`` when the status says every
    process of the run said goodbye."""
    overview = _get(url, "/rankscope/v1/status", {}, token)
    if not isinstance(overview, dict):
        return {"error": f"no answer from {url}"}
    listed = [e for e in overview.get("experiment_list") or [] if isinstance(e, dict)]
    if experiment is None and listed:
        furthest = max(listed, key=_furthest)
        experiment, run = furthest.get("id"), furthest.get("run") or None
    found: dict[str, Any] = {"experiments": listed, "experiment": experiment, "run": run}
    if experiment is not None:
        query = {"experiment": str(experiment), **({"run": str(run)} if run else {})}
        status = _get(url, "/rankscope/v1/status", query, token)
        recent = _get(url, "/rankscope/v1/recent", query, token)
        found["status"] = status if isinstance(status, dict) else {}
        found["run"] = found["status"].get("run") or run
        found["recent"] = [r for r in recent if isinstance(r, dict) and "step" in r] if isinstance(recent, list) else []
        found["ended"] = _ended(found["status"])
    return found


def _furthest(entry: dict[str, Any]) -> float:
    """How far a listed run is: its last finalized step (-1: none yet)."""
    step = _number(entry.get("last_finalized_step"))
    return -1.0 if step is None else step


def _ended(status: dict[str, Any]) -> str | None:
    """Why the status's run is over: every process of it said goodbye (its entry in ``runs``)."""
    for entry in status.get("runs") or []:
        if isinstance(entry, dict) and entry.get("run") == status.get("run") and entry.get("ended"):
            return "every process said goodbye"
    return None


def _last_step(snap: dict[str, Any]) -> Any:
    recent = snap.get("recent") or []
    return recent[-1].get("step") if recent else None


class Follow:
    """What the live view shows from one poll to the next: a sink not answering yet, answering,
    the run ended (said by the sink, or the sink gone). ``take`` is the whole state change (the
    tests drive it with snapshots); ``stopped``: polling is over, the last screen stays."""

    def __init__(
        self,
        url: str,
        experiment: str | None,
        run: str | None = None,
        token: str | None = None,
        *,
        look: Callable[[], str] | None = None,
    ) -> None:
        self.url, self.experiment, self.run, self.token = url, experiment, run, token
        self.look = look
        """Finds the sink again while none has answered (no ``--sink``: a job's embedded sink
        starts with its first step)."""
        self.answered = False
        self.misses = 0
        self.last: dict[str, Any] = {}
        self.ended: str | None = None
        self.settling = 0
        self.stopped = False

    def poll(self) -> dict[str, Any]:
        """The next screen's snapshot (the last one again once polling stopped)."""
        if self.stopped:
            return self._marked()
        if self.look is not None and not self.answered:
            self.url = self.look()
        return self.take(snapshot(self.url, self.experiment, self.token, self.run))

    def take(self, snap: dict[str, Any]) -> dict[str, Any]:
        """The screen's snapshot after ``snap``, the state moved on."""
        if "error" in snap:
            if not self.answered:
                none = self.look is not None and self.url == DEFAULT_SINK
                looked = " (none announced on this machine: --sink URL names one)" if none else ""
                return {"error": f"waiting for a sink: no answer from {self.url} yet{looked}"}
            self.misses += 1
            if self.ended is None and self.misses < GONE_AFTER:
                return self._marked()  # one unanswered poll: the last screen stays
            self.ended = self.ended or f"the sink at {self.url} is gone"
            self.stopped = True
            return self._marked()
        self.answered, self.misses = True, 0
        if snap.get("experiment") is None:
            snap["experiment"] = self._announced()
        if snap.get("ended"):
            unchanged = self.ended is not None and _last_step(self.last) == _last_step(snap)
            self.ended = str(snap["ended"])
            self.settling += 1
            self.stopped = unchanged or self.settling >= SETTLE_POLLS
        else:
            self.ended, self.settling = None, 0  # going on (again: a restart)
        self.last = snap
        return self._marked()

    def _marked(self) -> dict[str, Any]:
        return {**self.last, "ended": self.ended, "stopped": self.stopped}

    def _announced(self) -> str | None:
        """The experiment the sink announced (an embedded sink serves one), for the waiting line."""
        if self.look is None:
            return self.experiment
        from ..sink.embedded import discover

        found = [f.get("experiment") for f in discover() if f.get("control") == self.url]
        return str(found[0]) if found and found[0] else self.experiment


# -- the screen -------------------------------------------------------------------------------


class Fitted:
    """A renderable built for the width it is drawn at (``build(width)``): tables whose keys are
    cut to fit, distinct (``fit``), rather than cut at their end by the terminal."""

    def __init__(self, build: Callable[[int], RenderableType]) -> None:
        self.build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        yield self.build(options.max_width)


def render(snap: dict[str, Any], keys: list[str] | None, now: float | None = None) -> Group:
    """The screen for one snapshot (a pure function: the tests and ``--once`` print it)."""
    from rich.console import Group
    from rich.text import Text

    now = time.time() if now is None else now
    if "error" in snap:
        return Group(Text(f"rankscope top: {snap['error']}", style="bold yellow"))
    parts: list[Any] = []
    ended = snap.get("ended")
    if ended:
        stopped = "; top stopped watching" if snap.get("stopped") else ""
        parts.append(Text(f"run ended ({printable(ended)}){stopped}", style="bold yellow"))
    if snap.get("experiments"):
        parts.append(Fitted(lambda width: _experiments(snap, width)))
    status, recent = snap.get("status") or {}, snap.get("recent") or []
    if not recent:
        parts.append(Text(_waiting(snap, status), style="yellow"))
        return Group(*parts)
    last = recent[-1]
    parts.append(_header(snap, status, recent, now))
    shown = keys or default_keys(recent)
    parts.append(Fitted(lambda width: _values(shown, recent, width)))
    if _phases(last):
        parts.append(Fitted(lambda width: _phase_map(last, width)))
    parts.extend(_notes(last, status))
    return Group(*parts)


def _waiting(snap: dict[str, Any], status: dict[str, Any]) -> str:
    """``waiting for the first step of exp (2 processes seen)``; a run that ended without one."""
    experiment = snap.get("experiment")
    of = f" of {printable(experiment)}" if experiment is not None else ""
    if snap.get("ended"):
        return f"no step{of} was finalized"
    processes = _number(status.get("processes"))
    if processes is None:
        listed = [e for e in snap.get("experiments") or [] if e.get("id") == experiment]
        processes = _number(listed[0].get("processes")) if listed else None
    n = int(processes or 0)
    return f"waiting for the first step{of} ({n} process{'es' * (n != 1)} seen)"


def _experiments(snap: dict[str, Any], width: int) -> Table:
    """The sink's experiments, the chosen one in bold; ids cut to fit ``width``, distinct."""
    from rich.table import Table
    from rich.text import Text

    listed = snap["experiments"][:MAX_ROWS]
    experiments = Table(title="experiments", expand=False)
    id_width = max(8, (width - 4 * _OVERHEAD - 1 - len("processes") - len("last step")) // 2)
    ids = fit((printable(e.get("id")) for e in listed), id_width)
    runs = fit((printable(e.get("run") or "-") for e in listed), id_width)
    for column in ("experiment", "run", "processes", "last step"):
        experiments.add_column(column, no_wrap=True)
    for e in listed:
        chosen = "bold" if (e.get("id"), e.get("run")) == (snap["experiment"], snap.get("run")) else ""
        last = _number(e.get("last_finalized_step"))
        experiments.add_row(
            Text(ids[printable(e.get("id"))], style=chosen),
            Text(runs[printable(e.get("run") or "-")], style=chosen),
            _show(e.get("processes")),
            _show(last) if last is not None and last >= 0 else "-",
        )
    return experiments


def _header(snap: dict[str, Any], status: dict[str, Any], recent: list[dict[str, Any]], now: float) -> Text:
    """The chosen experiment's last step, lag, step rate and counts."""
    from rich.text import Text

    last = recent[-1]
    rate = step_rate(recent)
    finalized = _number(last.get("time"))
    lag = "" if snap.get("ended") or finalized is None else f"lag {max(0.0, now - finalized):.1f}s  "
    listed = any(e.get("run") == snap.get("run") for e in snap.get("experiments") or [])
    run = f"  run {printable(snap['run'])}" if snap.get("run") and not listed else ""  # else the table has it
    header = (
        f"{printable(snap['experiment'])}  step {_show(last['step'])}  {lag}"
        f"{'-' if rate is None else f'{rate:.3g}'} steps/s  processes {_show(status.get('processes'))}  "
        f"refused {_show(status.get('refused_points', 0))}  missing {len(last.get('missing') or [])}{run}"
    )
    return Text(header, style="bold")


def _values(keys: list[str], recent: list[dict[str, Any]], width: int) -> Table:
    """The keys with their last, min and max over the recent steps and a sparkline of as many of
    the last steps as fit ``width``; the keys cut to fit, distinct (``fit``). A terminal too narrow
    for a key's first ``KEY_ROOM`` characters beside them drops the min and max."""
    from rich.table import Table
    from rich.text import Text

    rows = []
    for key in keys:
        series = [_number((r.get("values") or {}).get(key)) for r in recent]
        finite = [v for v in series if v is not None and math.isfinite(v)]
        numbers = (_fmt(series[-1]), _fmt(min(finite) if finite else None), _fmt(max(finite) if finite else None))
        rows.append((printable(key), numbers, series))
    longest = max([3, *(len(r[0]) for r in rows)])
    headers = ("last", "min", "max")
    for kept in (3, 1):
        widths = [max(len(h), *(len(r[1][i]) for r in rows)) for i, h in enumerate(headers[:kept])]
        room = width - (kept + 2) * _OVERHEAD - 1 - sum(widths)
        if room > min(longest, KEY_ROOM):
            break
    key_width = max(3, min(longest, max(room - 10, room // 2)))
    spark_room = max(1, room - key_width)
    n = max(1, min(len(recent), spark_room))
    title = next((t for t in (f"last {n} steps", f"last {n}", "") if len(t) <= spark_room), "")
    names = fit((r[0] for r in rows), key_width)
    values = Table(title="keys", expand=False)
    values.add_column("key", no_wrap=True)
    for header in headers[:kept]:
        values.add_column(header, no_wrap=True)
    values.add_column(title, no_wrap=True, max_width=max(n, len(title)))
    for name, numbers, series in rows:
        values.add_row(Text(names[name]), *numbers[:kept], sparkline(series[-n:]))
    return values


def _phases(last: dict[str, Any]) -> list[str]:
    heat = last.get("phases")
    return [name for name, cells in heat.items() if cells][:MAX_PHASES] if isinstance(heat, dict) else []


def _phase_map(last: dict[str, Any], width: int) -> Table:
    """The last step's rank x phase seconds: a row per process, a column per phase; a row per
    phase instead when only that shows every name whole in ``width`` (a few processes, long phase
    names). As many columns as fit, their names and the rows' cut to fit, distinct (the rest
    counted in the title). Marked in each phase: the process the sink judged furthest over the
    others net of its waits (in a collective's column, the last to arrive), never a rank that only
    waited; a sink before that judgement sent its marks: the slowest cell."""
    from rich.table import Table
    from rich.text import Text

    heat_of: dict[str, dict[str, Any]] = last["phases"]
    phases = _phases(last)
    late = last.get("late")
    if isinstance(late, dict):
        mark, marked = "* late", {phase: late.get(phase) for phase in phases}
    else:
        mark = "* slowest"
        marked = {phase: max(heat_of[phase].items(), key=lambda kv: _number(kv[1]) or 0.0)[0] for phase in phases}
    labels = sorted({str(p) for phase in phases for p in heat_of[phase]})[:MAX_ROWS]
    cells = {
        (printable(label), printable(phase)): _seconds(heat_of[phase].get(label), marked[phase] == label)
        for phase in phases
        for label in labels
    }
    processes, names = [printable(label) for label in labels], [printable(phase) for phase in phases]
    cell_width = max(len(c) for c in cells.values())

    def needs(rows: list[str], columns: list[str]) -> int:
        return 1 + max(len(r) for r in rows) + _OVERHEAD + sum(max(cell_width, len(c)) + _OVERHEAD for c in columns)

    by_phase = needs(processes, names) > width and needs(names, processes) <= width
    corner, rows, columns = ("phase", names, processes) if by_phase else ("process", processes, names)
    row_width = min(max(24, width // 3), max(len(corner), *(len(r) for r in rows)))
    room = width - 1 - (row_width + _OVERHEAD)
    shown = columns[: max(1, room // (cell_width + _OVERHEAD))]
    row_names, column_names = fit(rows, row_width), fit(shown, _cap([len(c) for c in shown], room, cell_width))
    left = len(columns) - len(shown)
    more = f"; {left} more {'processes' if by_phase else 'phases'}: a wider terminal shows them" if left else ""
    heat = Table(title=f"seconds per phase, step {_show(last['step'])} ({mark}{more})", expand=False)
    heat.add_column(corner, no_wrap=True)
    for column in shown:
        heat.add_column(Text(column_names[column]), no_wrap=True)
    for row in rows:
        texts = [cells[(column, row) if by_phase else (row, column)] for column in shown]
        heat.add_row(Text(row_names[row]), *(Text(c, style="red" if c.endswith("*") else "") for c in texts))
    return heat


def _cap(widths: list[int], room: int, least: int) -> int:
    """The widest a column may be so that columns of ``widths`` (each with its ``_OVERHEAD``) fit
    ``room``: the narrow ones whole, the wide ones cut to the same width, never below ``least``."""
    budget = room - _OVERHEAD * len(widths)
    cap = max(widths)
    while cap > least and sum(max(least, min(w, cap)) for w in widths) > budget:
        cap -= 1
    return cap


def _seconds(value: Any, marked: bool) -> str:
    seconds = _number(value)
    return "-" if seconds is None else f"{seconds:.3f}{'*' if marked else ' '}"


def _notes(last: dict[str, Any], status: dict[str, Any]) -> list[Text]:
    """Stragglers, missing processes, the first non-finite value, anomalies and captures."""
    from rich.text import Text

    notes = [Text(line, style="red") for line in streaks(last, status)]
    if last.get("missing"):
        notes.append(Text(f"missing: {', '.join(printable(m) for m in last['missing'][:16])}", style="yellow"))
    first = status.get("first_nonfinite")
    if isinstance(first, dict):
        where = f" at step {_show(first.get('step'))}" if first.get("step") is not None else ""
        who = f" from {printable(first.get('process'))}" if first.get("process") else ""
        notes.append(Text(f"first non-finite: {_show(first.get('key'))}{where}{who}", style="red"))
    anomalies = [a for a in status.get("anomalies") or [] if isinstance(a, dict)][-5:]
    if anomalies:
        said = (_show(a.get("type")) + (f"@{_show(a['step'])}" if a.get("step") is not None else "") for a in anomalies)
        notes.append(Text("anomalies: " + "; ".join(said)))
    for c in [c for c in status.get("captures") or [] if isinstance(c, dict)][-3:]:
        files = f" ({len(c.get('files') or [])}/{_show(c.get('taken'))} files)" if c.get("taken") is not None else ""
        notes.append(Text(f"capture {_show(c.get('id'))}: {_show(c.get('reason'))}{files}"))
    return notes


def streaks(last: dict[str, Any], status: dict[str, Any]) -> list[str]:
    """The straggler streaks going on at the last step, one line each: ``straggler: trainer_r2 in
    train/forward since step 3 (12 steps), +150.1ms (352.6x the others); arrived last at
    all_reduce, 3 others waited up to 150ms``. From the status route's records (the sink keeps
    each streak's record up to date: its ``last_step`` and ``steps``), else the last step's own."""
    records = _read(status.get("anomalies"), Straggler) or _read(last.get("anomalies"), Straggler)
    lines: dict[tuple[Any, ...], str] = {}
    for a in records:
        if a.last_step < last["step"] - 1:  # it ended (one step behind: the status was read
            continue  # before the recent steps, so it may go on at the last one)
        since = f" since step {a.first_step} ({a.steps} step{'s' * (a.steps != 1)})"
        where = f"straggler: {a.process}{straggler_where(a.phase)}{since}"
        lines[(a.process, a.first_step)] = printable(where + straggler_details(a))
    for o in _read(status.get("outlier_streaks"), Outlier) or _read(last.get("anomalies"), Outlier):
        if o.last_step >= last["step"] - 1:  # going on: the process, its key against the others
            since = f" since step {o.first_step} ({o.steps} step{'s' * (o.steps != 1)})"
            lines[(o.process, o.key, o.first_step)] = printable(f"outlier: {o.process} {outlier_details(o)}{since}")
    return list(lines.values())


R = TypeVar("R", bound=Anomaly)


def _read(records: Any, kind: type[R]) -> list[R]:
    """The records of ``kind`` among a status's serialized ones (anything else is skipped)."""
    read = (from_json(r) for r in records or () if isinstance(r, dict))
    return [r for r in read if isinstance(r, kind)]


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """Single keys from the terminal without Enter (cbreak), restored on the way out."""
    if not sys.stdin.isatty():
        yield None
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(fd: int | None, timeout: float) -> bool:
    if fd is None:
        time.sleep(timeout)
        return False
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready) and os.read(fd, 32).lower().startswith(b"q")


def watch(
    url: str,
    experiment: str | None,
    keys: list[str] | None,
    interval: float,
    token: str | None,
    once: bool,
    run_id: str | None = None,
    look: Callable[[], str] | None = None,
) -> int:
    """Draw the sink's screen every ``interval`` seconds until q, Ctrl-C, or the run ended
    (``Follow``): then the last screen stays on the terminal. ``look`` finds the sink again
    while none has answered. ``once``: one screen (exit 1 when the sink did not answer)."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    follow = Follow(url, experiment, run_id, token, look=look)
    if once:
        snap = snapshot(url, experiment, token, run_id)
        console.print(render(snap, keys))
        return 1 if "error" in snap else 0
    with _keys() as fd, Live(console=console, auto_refresh=False, transient=False) as live:
        try:
            while not follow.stopped:
                live.update(render(follow.poll(), keys), refresh=True)
                if not follow.stopped and _quit_pressed(fd, interval):
                    return 0
            _quit_pressed(fd, ENDED_LINGER)  # the run ended: its last screen stays a while, q leaves sooner
        except KeyboardInterrupt:
            return 0
    return 0


def add_parser(commands: Any) -> None:
    t = commands.add_parser("top", help="a live terminal view of a running sink (q quits)")
    t.add_argument(
        "--sink",
        help="the sink's HTTP URL (default: the newest `rankscope run` or embedded sink on this machine, "
        "else http://127.0.0.1:4318; looked for until one answers)",
    )
    t.add_argument("--experiment", help="experiment id (default: the one furthest along)")
    t.add_argument("--run", help="run of the experiment (default: its latest)")
    t.add_argument(
        "--keys", help="keys to chart, comma-separated (default: six, your own first, then phases, then rankscope's)"
    )
    t.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    t.add_argument(
        "--once", action="store_true", help="print one screen and exit (1 when no sink answers: nothing is waited for)"
    )
    t.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    t.set_defaults(fn=command)


def command(args: argparse.Namespace) -> int:
    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    token = args.token or os.environ.get("RANKSCOPE_SINK_TOKEN")
    url = find_sink(args.sink)
    look = None if args.sink else lambda: find_sink(None)  # a job's embedded sink starts with its first step
    interval = max(0.1, min(args.interval, 1.0))
    return watch(url, args.experiment, keys, interval, token, args.once, args.run, look)
