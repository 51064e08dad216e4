"""Where a step's time went: the heat map (seconds per phase per process, over steps) and the
Gantt of a few chosen steps (``heat`` and ``gantt`` events).

Bounded however many processes, phases and steps: at most ``HEAT_STEPS`` heat maps, thinned as
a series is (the last one always shown), of at most ``HEAT_ROWS`` rows (bands of ranks past
that) by ``MAX_PHASES`` phases; at most ``MAX_GANTTS`` Gantts of ``MAX_GANTT_SPANS`` bars.

A step chosen for several reasons (the first straggler step is often the slowest too) is one
Gantt on the page, its reasons joined (``gantts``); each Gantt's x axis is the step's own time
range where spans from before or after it would squeeze it (``focus_of``).
"""

from __future__ import annotations

from typing import Any

from .values import integer, listed, number, strict, text

HEAT_ROWS = 128
HEAT_STEPS = 100
MAX_PHASES = 32
MAX_GANTT_SPANS = 20_000
MAX_GANTTS = 8
WHY_ORDER = ("first straggler", "slowest step", "last step")
"""The page's order of the chosen steps' Gantts (then those asked for, in the order they came)."""
FOCUS_ROLE = "trainer"
FOCUS_SHARE = 0.75
"""The least share of a Gantt's x axis its step's own time range gets before the rest is cut."""


class Phases:
    """The heat maps and Gantts (module docstring)."""

    def __init__(self) -> None:
        self.heat: dict[int, dict[str, Any]] = {}
        self.heat_stride = 1
        self._heat_seen = 0
        self.last_heat: tuple[int, dict[str, Any]] | None = None
        self.gantt: dict[str, dict[str, Any]] = {}
        """Why (``last``, ``slowest``, ``straggler``, ``asked N``) → ``{"step", "ms", "spans", "more"}``."""

    def add_heat(self, step: int, heat: dict[str, Any]) -> None:
        """A step's heat map (``heat_of``'s): every ``heat_stride``-th is kept, and the last."""
        entry = _heat_entry(heat)
        self.last_heat = (step, entry)
        if self._heat_seen % self.heat_stride == 0:
            self.heat[step] = entry
            if len(self.heat) > HEAT_STEPS:
                self.heat_stride *= 2
                self.heat = dict(list(self.heat.items())[::2])
        self._heat_seen += 1

    def add_gantt(self, event: dict[str, Any]) -> None:
        """A ``gantt`` event: it replaces the Gantt of the same why (a new why past ``MAX_GANTTS``: dropped)."""
        why, step = text(event["why"])[:64], integer(event["step"])
        spans = event["spans"]
        if step is None or not isinstance(spans, list):
            raise ValueError("gantt")
        if why not in self.gantt and len(self.gantt) >= MAX_GANTTS:
            return
        bars = [_bar(b) for b in spans[:MAX_GANTT_SPANS] if isinstance(b, dict)]
        more = integer(event.get("more")) or 0
        self.gantt[why] = {"step": step, "ms": number(event.get("ms")), "spans": [b for b in bars if b], "more": more}

    def drop_from(self, step: int) -> None:
        """A rewind: the heat maps of ``step`` and later go (the Gantts stay: each names its step)."""
        self.heat = {s: entry for s, entry in self.heat.items() if s < step}
        if self.last_heat is not None and self.last_heat[0] >= step:
            self.last_heat = None

    def state(self) -> dict[str, Any]:
        """This part of a ``snapshot`` event."""
        return {
            "heat": [[step, entry] for step, entry in self.heat.items()],
            "heat_stride": self.heat_stride,
            "heat_seen": self._heat_seen,
            "last_heat": list(self.last_heat) if self.last_heat is not None else None,
            "gantt": [{"why": why, **g} for why, g in self.gantt.items()],
        }

    @classmethod
    def restore(cls, event: dict[str, Any]) -> Phases:
        """The part a snapshot holds, checked (``ValueError``: malformed)."""
        new = cls()
        new.heat = {strict(step): _heat_entry(entry) for step, entry in listed(event["heat"], HEAT_STEPS)}
        new.heat_stride, new._heat_seen = strict(event["heat_stride"], 1), strict(event["heat_seen"])
        if event["last_heat"] is not None:
            step, entry = event["last_heat"]
            new.last_heat = (strict(step), _heat_entry(entry))
        for gantt in listed(event["gantt"], MAX_GANTTS):
            new.add_gantt(gantt)
        return new

    def data(self) -> dict[str, Any]:
        """This part of the page's data: the heat maps by step, the Gantts."""
        heat = dict(self.heat)
        if self.last_heat is not None:
            heat[self.last_heat[0]] = self.last_heat[1]
        return {"heat": [{"step": step, **entry} for step, entry in sorted(heat.items())], "gantt": gantts(self.gantt)}


def gantts(kept: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's Gantts: one per step, in ``WHY_ORDER``. A step kept for several reasons (the
    first straggler step that is also the slowest) is drawn once, with every reason (``whys``,
    ``why`` their words) and the copy of its bars that holds the most spans. Each with its
    ``focus`` (``focus_of``)."""
    rank = {why: i for i, why in enumerate(WHY_ORDER)}
    by_step: dict[int, dict[str, Any]] = {}
    for why, g in sorted(kept.items(), key=lambda item: rank.get(item[0], len(rank))):  # stable: asked in order
        held = by_step.get(g["step"])
        if held is None:
            by_step[g["step"]] = {**g, "whys": [why]}
            continue
        held["whys"].append(why)
        if len(g["spans"]) + g["more"] > len(held["spans"]) + held["more"]:
            held.update(spans=g["spans"], ms=g["ms"], more=g["more"])
    out = list(by_step.values())
    for g in out:
        *rest, final = g["whys"]
        g["why"] = f"{', '.join(rest)} and {final}" if rest else final
        g["focus"] = focus_of(g["spans"])
    return out


def focus_of(spans: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The step's own time range, for its Gantt's x axis, where the spans around it would leave
    it under ``FOCUS_SHARE`` of the axis; None: the whole step fits (or nothing says what the step's own spans are).

    The step's own spans are its trainer's (role ``trainer``), else those of the role whose
    process holds the step's root span (``step``, without a parent). In an RL job the generator
    made the rollout a trainer step learns from before that step began, its span seconds ahead
    of the trainer's: drawn whole, it squeezes the step's bars into a small part of the width.

    Why a cut and not a broken axis or a log scale: on one linear axis a bar's length is its
    duration everywhere, so the ranks' phases compare at a glance; a broken axis (two scales side
    by side, which plotly cannot draw on one axis) and a log axis both make equal lengths mean
    different durations. The spans cut stay findable: each is drawn cut at the axis' edge and
    its row marked there (hover: its name and when it began and ended, in ms from the step's own
    start, so negative before it), the link arrows from it start at the edge, and the Perfetto
    file (``rankscope gantt``) has it whole.

    Returns ``from`` and ``to`` (ms on the bars' clock), the ``role``, and how many spans began
    ``before`` it or ended ``after`` it."""
    role = FOCUS_ROLE if any(b["o"] == FOCUS_ROLE for b in spans) else None
    if role is None:
        role = next((b["o"] for b in spans if b["n"] == "step" and not b["u"] and b["o"]), None)
    own = [b for b in spans if b["o"] == role] if role is not None else []
    if not own:
        return None
    low, high = min(b["s"] for b in own), max(b["s"] + b["d"] for b in own)
    first, last = min(b["s"] for b in spans), max(b["s"] + b["d"] for b in spans)
    if high <= low or high - low >= FOCUS_SHARE * (last - first):
        return None
    before = sum(1 for b in spans if b["s"] < low)
    after = sum(1 for b in spans if b["s"] + b["d"] > high)
    return {"from": low, "to": high, "role": role, "before": before, "after": after}


def _heat_entry(heat: dict[str, Any]) -> dict[str, Any]:
    rows = [text(r) for r in heat["rows"]][: HEAT_ROWS + 1]
    phases = [text(p) for p in heat["phases"]][:MAX_PHASES]
    z = [[number(v) for v in line[: len(phases)]] for line in heat["z"][: len(rows)]]
    return {"rows": rows, "phases": phases, "z": z, "band": integer(heat.get("band")) or 1}


def _bar(bar: dict[str, Any]) -> dict[str, Any] | None:
    """A Gantt bar from the file, as ``gantt_spans`` made it (anything else: None)."""
    start, duration = number(bar.get("s")), number(bar.get("d"))
    if start is None or duration is None:
        return None
    out: dict[str, Any] = {k: text(bar.get(k) or "") for k in ("p", "o", "n", "i", "u")}
    out.update(r=integer(bar.get("r")), s=start, d=duration)
    if isinstance(bar.get("l"), list):
        out["l"] = [text(x) for x in bar["l"][:16]]
    if isinstance(bar.get("c"), str):
        out["c"] = text(bar["c"])
    waited = number(bar.get("w"))
    if waited is not None:
        out["w"] = waited
    if bar.get("a") is True:
        out["a"] = True
    return out
