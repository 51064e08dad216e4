"""What the transports need of the sink, and nothing more: the ports the edge talks through.

``Ingest`` is what an OTLP export calls (gRPC and HTTP alike) and ``Result`` what it answers;
``Control`` is what the control routes read (``ControlQueries``) and change (``ControlCommands``)
(``edge.control``); ``Transport`` is the part of the sink's configuration the servers read;
``Spawn`` starts a supervised thread (a server's event loop). The sink's coordinator
(``sink.service``) and its control parts (``sink.queries``, ``sink.commands``) fill these ports
when they start the transports: no transport imports them, or calls a private method.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..checked import ALL, Refusals, Scope, SpanQuery
from .errors import Refusal

Spawn = Callable[[str, Callable[[], None]], threading.Thread]
"""``spawn(name, target)``: ``target`` on a supervised thread (``/healthz`` names it if it dies)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Transport:
    """How the servers listen and whom they take (``SinkConfig.transport``; fixed while the sink runs)."""

    host: str = "127.0.0.1"
    token: str | None = None
    """The bearer token both transports check (``edge.auth``) for every experiment (``--token``);
    None: with no ``tokens`` either, the sink takes anyone."""
    tokens: Mapping[str, Scope] = field(default_factory=dict)
    """Scoped tokens (``--tokens FILE``, ``edge.auth.load_tokens``): each may write only its scope's
    experiments, and only its scope's runs (``runs.runbook``). Teams sharing a sink need them:
    without, every client is one scope."""
    max_body_bytes: int = 32 * 1024 * 1024
    max_connections: int = 0
    """Open HTTP connections at most; idle ones are closed after ``idle_connection_timeout``. A
    newcomer beyond closes the connection that has waited longest for its request head, else the
    slowest body, else the one idle longest (``edge.connections``). gRPC's incoming connections
    are held to the same number. 0: derived from the process's descriptor limit when the sink
    starts (``durable.descriptors.Plan``: 1024, fewer under a low ``ulimit -n``)."""
    per_peer_connections: int = 0
    """Open HTTP connections of one peer address at most (its newcomer beyond closes one of its
    own by the same order). 0: a quarter of ``max_connections``, at least 8."""
    idle_connection_timeout: float = 15.0
    header_timeout: float = 5.0
    """Seconds a request head may take to arrive whole (from its first byte, or the connection's
    opening), and a gRPC connection its handshake: a slower connection is closed."""
    body_timeout: float = 60.0
    """Seconds an OTLP/HTTP body may take to arrive, plus one per 64 KiB received (a trickled one
    would hold its connection and buffer): a slower one is answered 408 and its connection closed."""
    grpc_workers: int = 8

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or min(self.max_connections, self.per_peer_connections) < 0 or self.grpc_workers < 1:
            raise ValueError(
                "transport: max_body_bytes and grpc_workers must be >= 1, max_connections and per_peer_connections >= 0"
            )
        for name in ("idle_connection_timeout", "header_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"transport: {name} must be > 0 seconds, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class Client:
    """Who sent a request, as the edge knows it: the transports make one per request
    (``edge.auth``), the sink's parts decide by it (quotas, which runs a client may touch)."""

    peer: str = ""
    """The connection's host (``""``: in the sink's own process: the embedded sender, tests)."""
    scope: Scope = ALL
    """Its bearer token's scope (``edge.auth``): which experiments it may write, which runs are its."""
    alive: Callable[[], bool] = lambda: True
    """Whether it still waits for the answer (its connection open, its call not cancelled): a
    request stops opening runs once it does not (``runs.opening.Openings``)."""

    @property
    def quota_key(self) -> str:
        """What per-client bounds count by: its scoped token, else its host (every client of one
        scope on one host, e.g. behind a Collector, counts as one), an IPv6 host by its /64 (what
        one machine or one customer is given: its addresses are one client)."""
        if self.scope.name:
            return f"scope {self.scope.name}"
        return network_of(self.peer)


def network_of(host: str) -> str:
    """An IPv6 address's /64 (an IPv4 one, or one mapped into IPv6, as it is; a name as it is)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return host


LOCAL = Client()
"""A caller inside the sink's own process."""


@dataclass
class Result:
    """What one export answers: OTLP's ``partial_success``."""

    accepted: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        return "; ".join(self.errors[:8])

    @classmethod
    def of(cls, total: int, refused: Refusals) -> Result:
        return cls(max(0, total - refused.count), refused.count, refused.reasons)


class Ingest(Protocol):
    """OTLP in: each call takes a request (over protobuf still encoded: ``otlp.raw.parse_metrics``,
    ``parse_traces``, ``parse_logs``; the sink decodes it under its bounds, ``edge.cost``) and the
    ``Client`` that sent it, and raises ``edge.errors.RefusedError`` for a request refused whole
    (over a bound of ``checked.Limits``, undecodable), ``OverloadedError`` (its kind says why) when
    the sink is at capacity, stopping, the run was closing or the data cannot be made durable."""

    def export_metrics(self, request: Any, client: Client = LOCAL) -> Result: ...

    def export_traces(self, request: Any, client: Client = LOCAL) -> Result: ...

    def export_logs(self, request: Any, client: Client = LOCAL) -> Result: ...


class ControlQueries(Protocol):
    """What the control routes read of the sink (``sink.queries``); every value is checked by the route."""

    def health(self) -> tuple[bool, list[str]]: ...

    def overview(self, scope: Scope = ALL) -> dict[str, Any]: ...

    def status(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None: ...

    def recent(self, experiment_id: str, run: str | None = None) -> list[dict[str, Any]] | None: ...

    def span_rows(self, query: SpanQuery) -> Iterator[str] | None: ...

    def capture_target(self, experiment_id: str, capture_id: str, process_id: str, size: int) -> Path: ...


class ControlCommands(Protocol):
    """What the control routes ask the sink to do (``sink.commands``); every value is checked by the route."""

    def configure(self, experiment_id: str, backends: Mapping[str, Mapping[str, Any]]) -> str: ...

    def report(self, experiment_id: str, timeout: float = 60.0, run: str | None = None) -> list[str] | Refusal: ...

    def capture(
        self,
        experiment_id: str,
        reason: str,
        steps: int,
        ranks: frozenset[int] | None = None,
        run: str | None = None,
    ) -> dict[str, Any] | Refusal: ...

    def pending_captures(self, experiment_id: str, process_id: str) -> list[dict[str, Any]]: ...

    def store_capture(self, experiment_id: str, capture_id: str, process_id: str, data: bytes) -> str: ...


@dataclass(frozen=True, slots=True)
class Control:
    """The control routes' port: what they read and what they change, apart."""

    queries: ControlQueries
    commands: ControlCommands
