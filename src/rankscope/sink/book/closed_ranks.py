"""Which ranks of each group closed which step, as merged flush markers say (``rankscope.flush.ranks``).

Through a Collector tree a rank's flush marker does not reach the sink as its own point: the merge
processor folds the markers of one (role, replica) group into ranges of ranks per step. Here they
land in one array per group, the last step each rank closed, so "who has not closed step N" is one
vectorized comparison over the group, whatever the number of ranks, and no ``Process`` is made
per rank. A rank is still named by its group and rank (``label_of``) when it is missing.

Pure bookkeeping: no clock, no I/O; ``roster`` owns it and decides what "missing" means.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...otlp.markers import Ranks
from ..checked import Group


class ClosedRanks:
    """Per group, the last step each of its ranks closed (-1: none yet)."""

    def __init__(self) -> None:
        self._last: dict[Group, np.ndarray] = {}

    def close(self, group: Group, size: int, ranks: Ranks, step: int) -> None:
        """``ranks`` closed ``step``; the group holds ``size`` ranks (those past it are not kept)."""
        last = self._last.get(group)
        if last is None or len(last) < size:
            grown = np.full(size, -1, dtype=np.int64)
            if last is not None:
                grown[: len(last)] = last
            last = self._last[group] = grown
        for low, high in ranks.spans:
            if low >= size:
                break
            part = last[low : min(high + 1, size)]
            np.maximum(part, step, out=part)

    def closed(self, group: Group, step: int) -> np.ndarray | None:
        """A mask of the group's ranks that closed ``step`` or a later one; None: the group sent none."""
        last = self._last.get(group)
        return None if last is None else last >= step

    def groups(self, attempt: int) -> Iterator[tuple[Group, int]]:
        """(group, its ranks) of every group of ``attempt`` that sent merged markers."""
        return ((g, len(last)) for g, last in self._last.items() if g[2] == attempt)

    def retire(self, attempt: int) -> None:
        """Forget the groups of attempts before ``attempt`` (the run restarted)."""
        for group in [g for g in self._last if g[2] < attempt]:
            del self._last[group]

    def __bool__(self) -> bool:
        return bool(self._last)
