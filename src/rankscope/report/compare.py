"""Runs of an experiment side by side: one page that overlays them.

``write_comparison(run_dirs, out)`` reads each run's ``report.jsonl`` (``summary.read``: the
file the report view writes, compacted or not) and writes one self-contained page
(``page.document``): a table of the runs (when each started: its ranks' first data,
``Summary.started_at``; its attempts, its steps, what went wrong: a late update only where it
could not be merged into its step, ``report.health``; and the configuration keys whose values
differ between runs: what each run's processes said of themselves in their Resource,
``summary.config_of``), then one chart per key with a
line per run, each run one colour on every chart; a run's legend entry hides it on that chart
and its box in the table on all of them. The keys come in the order of a run's own page
(``series.kind_of``): the user's first, then the seconds of traced phases, then rankscope's
internals, folded; a key constant in every run is a table row, not a chart.

Bounded as the run pages are: the newest ``MAX_RUNS`` runs (the others counted), each series
thinned to at most ``MAX_COMPARED_POINTS`` points (its last always drawn).

``page.run_dirs`` finds an experiment directory's runs (``rankscope report DIR``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..core.anomalies import Interrupted, NonFinite, Outlier
from . import page
from .series import Series, kind_of, meta_charted
from .summary import Summary, read
from .values import relative_link

MAX_RUNS = 16
MAX_COMPARED_POINTS = 500


def write_comparison(run_dirs: list[Path], out: Path) -> Path:
    """Write the page comparing the runs in ``run_dirs`` (each holding a ``report.jsonl``) to ``out``."""
    runs = [(directory, read(directory / page.DATA)) for directory in run_dirs]
    return page.write_html(render(runs, out), out)


def render(runs: list[tuple[Path, Summary]], out: Path) -> str:
    data = comparison(runs, out)
    return page.document(f"{data['title']} · rankscope", data, "compare.js")


# -- the page's data ------------------------------------------------------------------------------


def comparison(runs: list[tuple[Path, Summary]], out: Path) -> dict[str, Any]:
    """The comparison page's data: the runs (oldest first) and the keys, each with its lines."""
    ordered = sorted(runs, key=lambda r: (r[1].started_at() or math.inf, r[0].name))
    shown = ordered[-MAX_RUNS:]
    experiments = sorted({s.experiment for _, s in shown if s.experiment})
    experiment = " + ".join(experiments) or "(unnamed experiment)"
    configs = [_flat_config(s.config) for _, s in shown]
    differing = _differing(configs)
    table = [
        _run_row(directory, summary, out, {key: config.get(key) for key in differing})
        for (directory, summary), config in zip(shown, configs, strict=True)
    ]
    return {
        "experiment": experiment,
        "title": f"{experiment} · {len(shown)} run{'' if len(shown) == 1 else 's'} compared",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "runs": table,
        "runs_not_shown": len(ordered) - len(shown),
        "config_keys": differing,
        "keys": _keys([summary for _, summary in shown]),
    }


def _run_row(directory: Path, summary: Summary, out: Path, config: dict[str, str | None]) -> dict[str, Any]:
    started = summary.started_at()
    own = next((r for r in summary.runs if r["run"] == summary.run), None)
    attempt = own["attempt"] if own is not None else None
    short = summary.run[-8:] if summary.run else directory.name
    other = directory / page.PAGE
    return {
        "label": f"{page.when(started, precise=True)} · {short}" if started is not None else short,
        "run": summary.run or directory.name,
        "started": page.when(started, precise=True),
        "attempts": None if attempt is None else attempt + 1,
        "steps": summary.steps,
        "first_step": summary.first_step,
        "last_step": summary.last_step,
        "status": _status(summary),
        "config": config,
        "href": relative_link(os.path.relpath(other, out.parent)) if other.is_file() else None,
    }


def _status(summary: Summary) -> str:
    """What went wrong in a run, in a few words (``ok``: nothing the page counts)."""
    counts = summary.health.anomaly_counts
    stragglers = {s["process"] for s in summary.health.stragglers()}
    parts = []
    if stragglers:
        parts.append("straggler " + ", ".join(sorted(stragglers)[:3]) + (" …" if len(stragglers) > 3 else ""))
    outliers = sorted(
        {f"{a.get('process')} {a.get('key')}" for a in summary.health.anomalies() if a.get("type") == Outlier.KIND}
    )
    if outliers:
        parts.append("outlier " + ", ".join(outliers[:3]) + (" …" if len(outliers) > 3 else ""))
    if counts.get(NonFinite.KIND):
        parts.append(f"non-finite values at {counts['nonfinite']} step{'' if counts['nonfinite'] == 1 else 's'}")
    if summary.health.missing:
        missing = len(summary.health.missing)
        parts.append(f"{missing} step{'' if missing == 1 else 's'} missing processes")
    unmerged = summary.health.unmerged()  # a late update merged into its step left it exact: nothing went wrong
    if unmerged:
        lacking = "its step's values lack it" if unmerged == 1 else "their steps' values lack them"
        parts.append(f"{unmerged} late update{'' if unmerged == 1 else 's'} not merged ({lacking})")
    if summary.rewinds:
        parts.append(f"rewound {len(summary.rewinds)}×")
    ended = next((a for a in reversed(summary.health.anomalies()) if a.get("type") == Interrupted.KIND), None)
    if ended is not None:  # the step the job ended in (the last: an attempt before a restart ended too): first
        failed = _listed(ended.get("failed"))
        how = f"failed: {', '.join(failed[:3])}{' …' if len(failed) > 3 else ''} raised" if failed else "interrupted"
        parts.insert(0, f"{how} (step {ended.get('step')})")
    return "; ".join(parts) or "ok"


def _listed(value: object) -> list[str]:
    """A record's list field as the report keeps it (a JSON string, ``health``'s flat records)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [str(value)]
    return [str(v) for v in value] if isinstance(value, list) else []


def _flat_config(config: Mapping[str, Mapping[str, str | None]]) -> dict[str, str]:
    """A run's configuration as ``key → value``: an attribute every role agrees on under its own
    name, else one entry per role (``role: key``); a role's disagreeing processes: ``(varies)``."""
    out: dict[str, str] = {}
    keys = dict.fromkeys(key for attributes in config.values() for key in attributes)
    for key in keys:
        values = {role: attributes[key] for role, attributes in config.items() if key in attributes}
        if len(set(values.values())) == 1 and None not in values.values() and len(values) == len(config):
            out[key] = str(next(iter(values.values())))
        else:
            for role, value in values.items():
                out[f"{role}: {key}"] = "(varies)" if value is None else value
    return out


def _differing(configs: list[dict[str, str]]) -> list[str]:
    """The configuration keys whose value is not the same in every run (absent counts)."""
    keys = dict.fromkeys(key for config in configs for key in config)
    return [key for key in keys if len({config.get(key) for config in configs}) > 1]


def _named(summary: Summary) -> Iterator[tuple[str, str, Series]]:
    """A run's series in its page's order: by role (the most processes first), then global only,
    then the detector charts and rankscope's own."""
    series = summary.series
    by_role, alone = series.joined()
    for role in series.roles():
        yield from ((role, key, s) for (r, key), s in by_role.items() if r == role)
    yield from (("", key, s) for key, s in alone.items())
    yield from (("", key, s) for key, s in series.meta.items() if meta_charted(key))


def _keys(summaries: Iterable[Summary]) -> list[dict[str, Any]]:
    """One entry per key (and role) over the runs, in the order a run's page shows them: its kind
    (``metric``, ``duration``, ``internal``), its title and each run's line."""
    keys: dict[tuple[str, str], dict[str, Any]] = {}
    for index, summary in enumerate(summaries):
        for role, key, series in _named(summary):
            entry = keys.setdefault((role, key), {"key": key, "role": role, "kind": kind_of(key), "lines": []})
            entry["lines"].append({"run": index, "points": _thinned(series.data(key)["points"])})
    roles_of: dict[str, set[str]] = {}
    for role, key in keys:
        roles_of.setdefault(key, set()).add(role)
    order = {"metric": 0, "duration": 1, "internal": 2}
    out = sorted(keys.values(), key=lambda entry: order[entry["kind"]])  # stable: first seen within a kind
    for entry in out:
        many = len(roles_of[entry["key"]]) > 1 and entry["role"]
        entry["title"] = f"{entry['key']} ({entry['role']})" if many else entry["key"]
        entry["constant"] = all(_flat(line["points"]) for line in entry["lines"])
    return out


def _thinned(points: list[list[Any]]) -> list[list[Any]]:
    """``[step, value]`` of at most ``MAX_COMPARED_POINTS`` points, evenly, the last kept."""
    stride = max(1, -(-len(points) // MAX_COMPARED_POINTS))
    kept = points[::stride]
    if points and kept[-1] is not points[-1]:
        kept.append(points[-1])
    return [[p[0], p[1]] for p in kept]


def _flat(points: list[list[Any]]) -> bool:
    return bool(points) and all(p[1] == points[0][1] for p in points)
