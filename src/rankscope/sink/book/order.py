"""Where a run's keys go in its step views: by role, roles by name (a key several roles record,
``comm/*`` say, goes with the first of them by name), each role's keys in the order its processes
first recorded them.

The order depends on what the processes recorded, not on whose data reached the sink first: on a
busy box the generator's export may land after the trainers' one run and before them the next,
and two runs of one job must still list their keys alike (issue 41). A key is placed once; its
place among the others never moves after (a role that starts later slots in by its name).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")

MAX_ORDERED_KEYS = 100_000
"""Keys a run places; later new keys go last, in the order they merge."""

Place = tuple[str, int]
LAST: Place = ("\U0010ffff", 0)
"""The place of a key that has none (past ``MAX_ORDERED_KEYS``): after every role's."""


class KeyOrder:
    """Each key's place: (the first role by name that sent it, its index among that role's keys)."""

    def __init__(self, limit: int = MAX_ORDERED_KEYS) -> None:
        self.limit = limit
        self.places: dict[str, Place] = {}
        self._per_role: dict[str, int] = {}

    def place(self, role: str, keys: Iterable[str]) -> None:
        """``keys`` as one process of ``role`` sent them (the order it first recorded them in)."""
        places = self.places
        if len(places) >= self.limit:
            return
        n = self._per_role.get(role, 0)
        for key in keys:
            held = places.get(key)
            if held is None or role < held[0]:  # a key several roles record goes with the first by name
                places[key] = (role, n)
                n += 1
        self._per_role[role] = n

    def arrange(self, items: Iterable[tuple[str, T]]) -> list[tuple[str, T]]:
        """``(key, value)`` items in their keys' places (stable: unplaced keys keep their order)."""
        places = self.places
        return sorted(items, key=lambda item: places.get(item[0], LAST))
