"""The view threads' line of runs with mail, served one client at a time in turn.

A FIFO of runs lets a client with 2,000 busy runs put 2,000 turns ahead of another client's one
run: its step waits for all of them (9-46 s in a flood). ``FairLine`` keeps one line per client
(``edge.ports.Client.quota_key``: its token's scope, else its address) and hands out the next
item of each client in turn, so a client's next turn waits for one turn of every other client
with mail, whatever their number of runs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairLine(Generic[T]):
    """Items by owner, one owner's item after another's in turn (each owner's in order)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owners: OrderedDict[str, deque[T]] = OrderedDict()
        """Owners with items, in the order they are served next."""
        self._ends = 0
        """``end`` calls not yet handed out (each ends one ``get``-ing thread once the line is empty)."""

    def put(self, owner: str, item: T) -> None:
        with self._cond:
            self._owners.setdefault(owner, deque()).append(item)
            self._cond.notify()

    def end(self) -> None:
        """One waiting thread's ``get`` answers None once no item is left."""
        with self._cond:
            self._ends += 1
            self._cond.notify()

    def get(self) -> T | None:
        """The next owner's next item (blocks while there is none); None: ``end`` was called."""
        with self._cond:
            while not self._owners and not self._ends:
                self._cond.wait()
            if not self._owners:
                self._ends -= 1
                return None
            owner, items = next(iter(self._owners.items()))
            item = items.popleft()
            del self._owners[owner]
            if items:
                self._owners[owner] = items  # at the back: every other owner's turn comes first
            return item

    def __len__(self) -> int:
        with self._cond:
            return sum(len(items) for items in self._owners.values())
