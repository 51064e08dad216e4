"""Which process's value of a key is far from the others' in a step: the outliers' candidates.

From each (role, key)'s spread (``book.spread``): its highest and its lowest process against the
others' mean and standard deviation, named when the gap is at least ``outlier_sigmas`` of the
others' spread, ``outlier_min_rel`` of the others' mean (in magnitude) and ``outlier_min_abs``:
a loss of 1.80 where the others hold 1.00 ± 0.01 is 80 sigmas and 80 % off. Robust to a quiet
key whose processes agree exactly (spread 0: the relative and absolute margins decide). At
least ``outlier_min_others`` other processes (5): fewer others' spread is too noisy to judge
by. At most one process per side per key and step (a second outlier on the same side hides in
the others' spread). A candidate's figures are computed again from the others' values where
the sink has them (the moments lose digits when one value is far larger than the rest).

Which keys: the program's own (``catalog.key_kind`` "user": not rankscope's, not a traced phase's
durations; not a key rankscope's helpers record, ``rs.rl``'s and ``rs.throughput``'s in the
catalog; not a duration, ``*_s``) of MEAN and STD reduces, and a SUM key only when
``outlier_keys`` names it (per-rank counters legitimately differ); never a key ``outlier_skip``
names (fnmatch patterns).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fnmatch import fnmatchcase

from ...core.anomalies import Outlier
from ...metrics.catalog import BY_NAME, key_kind
from ..checked import Process
from ..views.detectors.base import Thresholds
from .spread import Extreme, Spread

MAX_SIGMAS = 1e9
"""What ``sigmas`` says when the others agree exactly (their spread is 0)."""
SECONDS = ("_s",)
"""Durations by rankscope's naming (``*_s``): time is the straggler judgement's, not a value's."""
RESOLUTION = 1e-9
"""A gap smaller than this share of the others' mean is float rounding, never an outlier."""


def judged_by(thresholds: Thresholds) -> Callable[[str, str], bool]:
    """Whether a key of a reduce type is judged for outliers (the module docstring)."""
    keys, skip = thresholds.outlier_keys, thresholds.outlier_skip

    def judged(key: str, reduce: str) -> bool:
        if any(fnmatchcase(key, pattern) for pattern in skip):
            return False
        if any(fnmatchcase(key, pattern) for pattern in keys):
            return True
        return reduce != "sum" and key_kind(key) == "user" and key not in BY_NAME and not key.endswith(SECONDS)

    return judged


def outliers(found: dict[tuple[str, str], Spread], thresholds: Thresholds) -> list[tuple[Outlier, Process]]:
    """The step's candidates over the thresholds, each its record (the detector makes streaks)."""
    out: list[tuple[Outlier, Process]] = []
    least = max(2, thresholds.outlier_min_others)
    for (_role, key), spread in found.items():
        if spread.n - 1 < least:
            continue
        for high in (True, False):
            extreme = spread.others(high)
            if extreme is not None and _over(extreme, thresholds):
                extreme = spread.exactly(extreme)  # the others' moments again, from their values
                if _over(extreme, thresholds):
                    out.append((_record(key, extreme), extreme.process))
    return out


def _over(extreme: Extreme, t: Thresholds) -> bool:
    gap = abs(extreme.deviation)
    return (
        gap >= t.outlier_sigmas * extreme.others_std
        and gap >= t.outlier_min_rel * abs(extreme.others_mean)
        and gap >= t.outlier_min_abs
        and gap > RESOLUTION * max(1.0, abs(extreme.others_mean))  # not a rounding's difference
    )


def _record(key: str, extreme: Extreme) -> Outlier:
    p, std = extreme.process, extreme.others_std
    sigmas = extreme.deviation / std if std > 0 else math.copysign(MAX_SIGMAS, extreme.deviation)
    return Outlier(
        process=p.label,
        role=p.role,
        replica=p.replica,
        rank=p.rank,
        key=key,
        value=extreme.value,
        others_mean=extreme.others_mean,
        others_std=std,
        sigmas=round(max(-MAX_SIGMAS, min(MAX_SIGMAS, sigmas)), 3),
        others=extreme.others,
    )
