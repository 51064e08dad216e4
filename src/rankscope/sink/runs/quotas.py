"""Who may open another run, and which open run makes room for it: the sink's admission of runs.

Run ids are the client's to choose, so a client could open runs until the sink holds no more.
Three bounds (``RunLimits``), each counted over the *open* runs:

- per experiment (``per_experiment``) and per client (``per_client``: ``edge.ports.Client.quota_key``,
  its token's scope or its address) count the runs that have not ended: a run whose processes all
  said goodbye counts against neither, and closes once its views wrote everything (``upkeep``);
- the sink-wide cap (``max_open``) protects the sink, not whoever came first: when it is full, a
  run that ended, else the least recently active quiet run of the client holding the most runs,
  closes to make room (it reopens where it left off on new data).

A bound that is reached first closes one of that experiment's (client's) own quiet runs; only
when all of them are busy (steps open, views writing) is the new run refused, with a reason
naming the bound. Pure bookkeeping under the registry's lock: the registry (``registry``) says
which runs are open, the opener (``opening``) asks, and the closer (``closing``) closes the ones chosen.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import RunLimits
from .runbook import RunKey

SCAN = 256
"""Open runs looked at, least recently active first, for one that may make room."""


class Candidate(Protocol):
    """What admission reads of an open run (``runs.tenant.Tenant``)."""

    @property
    def ended(self) -> bool:
        """Every process of the run said goodbye."""
        ...

    @property
    def closable(self) -> bool:
        """It may close now without losing anything: nothing open, nothing late, views written."""
        ...


@dataclass(slots=True)
class Verdict:
    """A new run may open (``refused`` None) once ``victims`` closed; else why not."""

    refused: str | None = None
    victims: list[RunKey] = field(default_factory=list)


class Quotas:
    """The open runs by experiment and by client, each least recently active first."""

    def __init__(self, limits: RunLimits) -> None:
        self.limits = limits
        self._lru: OrderedDict[RunKey, str] = OrderedDict()
        """Every open run -> the client that opened it, least recently active first."""
        self._experiments: dict[str, OrderedDict[RunKey, None]] = {}
        self._clients: dict[str, OrderedDict[RunKey, None]] = {}
        self.refused: dict[str, int] = {"experiment": 0, "client": 0, "sink": 0}
        self.made_room = 0
        """Runs closed to make room for a new one."""

    def touched(self, key: RunKey, client: str) -> None:
        """The run opened (``client`` opened it) or took data: the most recently active now."""
        known = self._lru.get(key)
        if known is None:
            self._lru[key] = client
            self._experiments.setdefault(key[0], OrderedDict())[key] = None
            self._clients.setdefault(client, OrderedDict())[key] = None
            return
        self._lru.move_to_end(key)
        self._experiments[key[0]].move_to_end(key)
        self._clients[known].move_to_end(key)

    def closed(self, key: RunKey) -> None:
        client = self._lru.pop(key, None)
        if client is None:
            return
        for index, name in ((self._experiments, key[0]), (self._clients, client)):
            group = index[name]
            group.pop(key, None)
            if not group:
                del index[name]

    def admit(
        self, experiment: str, client: str, runs: Mapping[RunKey, Candidate], busy: frozenset[RunKey] = frozenset()
    ) -> Verdict:
        """Whether a new run of ``experiment`` from ``client`` may open, and which runs close first
        (never one of ``busy``: found in use when asked before)."""
        limits = self.limits
        victims: list[RunKey] = []
        skip = set(busy)
        bounds = (
            ("experiment", self._experiments.get(experiment), limits.per_experiment),
            ("client", self._clients.get(client), limits.per_client),
        )
        for bound, group, limit in bounds:
            if group is None or len(group) < limit:
                continue
            live = [key for key in group if key not in victims and not runs[key].ended]
            if len(live) < limit:
                continue
            victim = next((k for k in itertools.islice(live, SCAN) if k not in skip and runs[k].closable), None)
            if victim is None:
                self.refused[bound] += 1
                return Verdict(_reason(bound, limit, experiment))
            victims.append(victim)
            skip.add(victim)
        if len(self._lru) - len(victims) >= limits.max_open:
            victim = self._room(runs, skip)
            if victim is None:
                self.refused["sink"] += 1
                return Verdict(
                    f"the sink holds {limits.max_open} runs open, each with steps open or views writing "
                    "(limit); retry shortly"
                )
            victims.append(victim)
        return Verdict(victims=victims)

    def made(self, victims: int) -> None:
        """``victims`` runs closed to make room for a new one."""
        self.made_room += victims

    def _room(self, runs: Mapping[RunKey, Candidate], taken: set[RunKey]) -> RunKey | None:
        """The open run that makes room at the sink-wide cap: one that ended, else the least recently
        active quiet run of the client holding the most runs."""
        best: RunKey | None = None
        most = 0
        for key, client in itertools.islice(self._lru.items(), SCAN):
            if key in taken or not runs[key].closable:
                continue
            if runs[key].ended:
                return key
            held = len(self._clients[client])
            if held > most:
                best, most = key, held
        return best

    def status(self) -> dict[str, Any]:
        """The status route's overview of admission."""
        return {
            "max_open": self.limits.max_open,
            "per_experiment": self.limits.per_experiment,
            "per_client": self.limits.per_client,
            "clients": len(self._clients),
            "most_held_by_one_client": max((len(g) for g in self._clients.values()), default=0),
            "refused_runs": dict(self.refused),
            "closed_to_make_room": self.made_room,
        }


def _reason(bound: str, limit: int, experiment: str) -> str:
    if bound == "experiment":
        return (
            f"experiment {experiment[:64]!r} has {limit} runs open (limit), each with steps open or views "
            "writing; runs that ended do not count"
        )
    return (
        f"this client has {limit} runs open (limit per client), each with steps open or views writing; "
        "runs that ended do not count"
    )
