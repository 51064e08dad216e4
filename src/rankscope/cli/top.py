"""``rankscope top``: a live terminal view of a running sink, read over its HTTP routes.

    rankscope top [--sink http://127.0.0.1:4318] [--experiment ID [--run RUN]] [--keys loss,grad_norm]

Without ``--sink`` it watches the newest sink running on this machine (a ``rankscope run``'s or
an embedded one, which announce themselves: ``sink.embedded.discover``).

Every ``--interval`` seconds (default 1, at most 1) it reads ``/rankscope/v1/status`` and
``/rankscope/v1/recent`` and redraws: the experiments and their runs, the chosen run's last finalized step, its
lag and step rate, chosen keys with sparklines over the last steps, a rank x phase map of the
last step's span seconds (in each phase the process late net of its waits marked), the straggler streaks going on
(who held the others up, in which phase, since which step, by how much, and who waited for it at
which collective), missing processes, refused points, anomalies and captures. Plain text in any
terminal (rich), so it works over SSH; ``q`` quits (so does Ctrl-C).
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
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # rich loads when the view draws: every other command starts without it
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

from ..backends.console import outlier_details, printable, straggler_details, straggler_where
from ..core import names as attr
from ..core.anomalies import Anomaly, Outlier, Straggler, from_json
from .sink import find_sink

SPARKS = "▁▂▃▄▅▆▇█"
MAX_ROWS = 16
MAX_PHASES = 8


def sparkline(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "·" * len(values)
    low, high = min(finite), max(finite)
    span = high - low or 1.0
    return "".join(SPARKS[int((v - low) / span * (len(SPARKS) - 1))] if math.isfinite(v) else "!" for v in values)


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
    and recent steps (run None: the experiment's latest)."""
    overview = _get(url, "/rankscope/v1/status", {}, token)
    if not isinstance(overview, dict):
        return {"error": f"no answer from {url}"}
    listed = overview.get("experiment_list", [])
    if experiment is None and listed:
        furthest = max(listed, key=lambda e: e.get("last_finalized_step", -1))
        experiment, run = furthest["id"], furthest.get("run") or None
    found: dict[str, Any] = {"experiments": listed, "experiment": experiment}
    if experiment is not None:
        query = {"experiment": experiment, **({"run": run} if run else {})}
        status = _get(url, "/rankscope/v1/status", query, token)
        recent = _get(url, "/rankscope/v1/recent", query, token)
        found["run"] = status.get("run") if isinstance(status, dict) else run
        found["status"] = status if isinstance(status, dict) else {}
        found["recent"] = [r for r in recent if isinstance(r, dict) and "step" in r] if isinstance(recent, list) else []
    return found


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def render(snap: dict[str, Any], keys: list[str] | None, now: float | None = None) -> Group:
    """The screen for one snapshot (a pure function: the tests and ``--once`` print it)."""
    from rich.console import Group
    from rich.text import Text

    now = time.time() if now is None else now
    if "error" in snap:
        return Group(Text(f"rankscope top: {snap['error']}", style="bold red"))
    parts: list[Any] = [_experiments(snap)]
    status, recent = snap.get("status") or {}, snap.get("recent") or []
    if not recent:
        parts.append(Text(f"{snap['experiment']}: no finalized step yet"))
        return Group(*parts)
    last = recent[-1]
    parts.append(_header(snap, status, recent, now))
    parts.append(_values(last, recent, keys))
    heat = _phase_map(last)
    if heat is not None:
        parts.append(heat)
    parts.extend(_notes(last, status))
    return Group(*parts)


def _experiments(snap: dict[str, Any]) -> Table:
    """The sink's experiments, the chosen one in bold."""
    from rich.table import Table
    from rich.text import Text

    experiments = Table(title="experiments", expand=False)
    for column in ("experiment", "run", "processes", "last step"):
        experiments.add_column(column)
    for e in snap["experiments"][:MAX_ROWS]:
        chosen = "bold" if (e.get("id"), e.get("run")) == (snap["experiment"], snap.get("run")) else ""
        experiments.add_row(
            Text(str(e.get("id")), style=chosen),
            Text(str(e.get("run") or "-"), style=chosen),
            str(e.get("processes")),
            str(e.get("last_finalized_step")),
        )
    return experiments


def _header(snap: dict[str, Any], status: dict[str, Any], recent: list[dict[str, Any]], now: float) -> Text:
    """The chosen experiment's last step, lag, step rate and counts."""
    from rich.text import Text

    last = recent[-1]
    window = recent[-10:]
    elapsed = float(window[-1].get("time", 0)) - float(window[0].get("time", 0))
    rate = (window[-1]["step"] - window[0]["step"]) / elapsed if elapsed > 0 else 0.0
    run = f"  run {snap['run']}" if snap.get("run") else ""
    header = (
        f"{snap['experiment']}  step {last['step']}  lag {max(0.0, now - float(last.get('time', now))):.1f}s  "
        f"{rate:.2f} steps/s  processes {status.get('processes', '?')}  "
        f"refused {status.get('refused_points', 0)}  missing {len(last.get('missing', []))}{run}"
    )
    return Text(header, style="bold")


def _values(last: dict[str, Any], recent: list[dict[str, Any]], keys: list[str] | None) -> Table:
    """The chosen keys (else the first six of the last step's own) with sparklines over the recent steps."""
    from rich.table import Table

    last_values = last.get("values") or {}
    shown = keys or [k for k in last_values if not k.startswith((attr.META_PREFIX, attr.STRAGGLER_PREFIX))][:6]
    values = Table(title="keys", expand=False)
    for column in ("key", "last", "min", "max", f"last {len(recent)} steps"):
        values.add_column(column)
    for key in shown:
        series = [float((r.get("values") or {}).get(key, math.nan)) for r in recent]
        finite = [v for v in series if math.isfinite(v)] or [math.nan]
        values.add_row(key, _fmt(series[-1]), _fmt(min(finite)), _fmt(max(finite)), sparkline(series))
    return values


def _phase_map(last: dict[str, Any]) -> Table | None:
    """The last step's rank x phase seconds; None without phases. Marked in each phase: the
    process the sink judged furthest over the others net of its waits (in a collective's column,
    the last to arrive), never a rank that only waited; a sink before that judgement sent its
    marks: the slowest cell."""
    from rich.table import Table
    from rich.text import Text

    phases = [name for name, cells in (last.get("phases") or {}).items() if cells][:MAX_PHASES]
    if not phases:
        return None
    late = last.get("late")
    if isinstance(late, dict):
        title, slowest = "* late", {phase: late.get(phase) for phase in phases}
    else:
        title = "* slowest"
        slowest = {phase: max(last["phases"][phase].items(), key=lambda kv: kv[1])[0] for phase in phases}
    heat = Table(title=f"seconds per phase, step {last['step']} ({title})", expand=False)
    heat.add_column("process")
    for phase in phases:
        heat.add_column(phase[-24:])
    labels = sorted({p for phase in phases for p in last["phases"][phase]})
    for label in labels[:MAX_ROWS]:
        cells = []
        for phase in phases:
            seconds = last["phases"][phase].get(label)
            mark = "*" if slowest[phase] == label else " "
            cells.append(
                Text(f"{seconds:.3f}{mark}" if seconds is not None else "-", style="red" if mark == "*" else "")
            )
        heat.add_row(label, *cells)
    return heat


def _notes(last: dict[str, Any], status: dict[str, Any]) -> list[Text]:
    """Stragglers, missing processes, the first non-finite value, anomalies and captures."""
    from rich.text import Text

    notes = [Text(line, style="red") for line in streaks(last, status)]
    if last.get("missing"):
        notes.append(Text(f"missing: {', '.join(last['missing'][:16])}", style="yellow"))
    first = status.get("first_nonfinite")
    if first:
        notes.append(
            Text(f"first non-finite: {first['key']} at step {first['step']} from {first['process']}", style="red")
        )
    anomalies = status.get("anomalies", [])[-5:]
    if anomalies:
        notes.append(Text("anomalies: " + "; ".join(f"{a['type']}@{a.get('step')}" for a in anomalies)))
    for c in status.get("captures", [])[-3:]:
        notes.append(Text(f"capture {c['id']}: {c['reason']} ({len(c['files'])}/{c['taken']} files)"))
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
) -> int:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    if once:
        console.print(render(snapshot(url, experiment, token, run_id), keys))
        return 0
    with _keys() as fd, Live(console=console, auto_refresh=False, transient=False) as live:
        try:
            while True:
                live.update(render(snapshot(url, experiment, token, run_id), keys), refresh=True)
                if _quit_pressed(fd, interval):
                    return 0
        except KeyboardInterrupt:
            return 0


def add_parser(commands: Any) -> None:
    t = commands.add_parser("top", help="a live terminal view of a running sink (q quits)")
    t.add_argument(
        "--sink",
        help="the sink's HTTP URL (default: the newest `rankscope run` or embedded sink on this machine, "
        "else http://127.0.0.1:4318)",
    )
    t.add_argument("--experiment", help="experiment id (default: the one furthest along)")
    t.add_argument("--run", help="run of the experiment (default: its latest)")
    t.add_argument("--keys", help="keys to chart, comma-separated (default: the first six of the last step)")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    t.add_argument("--once", action="store_true", help="print one screen and exit")
    t.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    t.set_defaults(fn=command)


def command(args: argparse.Namespace) -> int:
    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    token = args.token or os.environ.get("RANKSCOPE_SINK_TOKEN")
    url = find_sink(args.sink)
    return watch(url, args.experiment, keys, max(0.1, min(args.interval, 1.0)), token, args.once, args.run)
