"""What the transports need of the sink, and nothing more: the ports the edge talks through.

``Ingest`` is what an OTLP export calls (gRPC and HTTP alike) and ``Result`` what it answers;
``Control`` is what the control routes ask (``edge.control``); ``Transport`` is the part of the
sink's configuration the servers read; ``Spawn`` starts a supervised thread (a server's event
loop). The sink's coordinator (``sink.service``) and its control part (``sink.queries``) fill
these ports when they start the transports: no transport imports either, or calls a private
method.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..checked import ALL, Refusals, Scope

Spawn = Callable[[str, Callable[[], None]], threading.Thread]
"""``spawn(name, target)``: ``target`` on a supervised thread (``/healthz`` names it if it dies)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Transport:
    """What the servers read of ``SinkConfig``, made by ``SinkConfig.transport()`` at ``start`` (no
    defaults of its own: the configuration's are the only ones; fixed while the sink runs)."""

    host: str
    token: str | None
    """The bearer token both transports check (``edge.auth``) for every experiment; None: with no
    ``tokens`` either, the sink takes anyone."""
    tokens: Mapping[str, Scope]
    """Scoped tokens: each token -> the scope it writes for (``edge.auth.load_tokens``)."""
    max_body_bytes: int
    max_connections: int
    idle_connection_timeout: float
    header_timeout: float
    """Seconds a request head (HTTP) or a connection's handshake (gRPC) may take (``edge.connections``)."""
    body_timeout: float
    grpc_workers: int
    max_id_chars: int
    """An experiment id the control routes take (``checked.Limits.max_id_chars``, as the OTLP edge)."""


@dataclass(frozen=True, slots=True)
class Client:
    """Who sent a request, as the edge knows it: the transports make one per request
    (``edge.auth``), the sink's parts decide by it (quotas, which runs a client may touch)."""

    peer: str = ""
    """The connection's host (``""``: in the sink's own process: the embedded sender, tests)."""
    scope: Scope = ALL
    """Its bearer token's scope (``edge.auth``): which experiments it may write, which runs are its."""

    @property
    def quota_key(self) -> str:
        """What per-client bounds count by: its scoped token, else its host (every client of one
        scope on one host, e.g. behind a Collector, counts as one)."""
        return f"scope {self.scope.name}" if self.scope.name else self.peer


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
    """OTLP in: each call takes a decoded request (metrics: ``otlp.raw.parse_metrics``'s list) and
    the ``Client`` that sent it, and raises ``edge.bodies.OverloadedError`` when the sink is at
    capacity or cannot make data durable."""

    def export_metrics(self, request: Any, client: Client = LOCAL) -> Result: ...

    def export_traces(self, request: Any, client: Client = LOCAL) -> Result: ...

    def export_logs(self, request: Any, client: Client = LOCAL) -> Result: ...


class Control(Protocol):
    """What the control routes ask of the sink (``edge.control``); every value is checked by the route."""

    def health(self) -> tuple[bool, list[str]]: ...

    def configure(self, experiment_id: str, backends: Mapping[str, Mapping[str, Any]]) -> str: ...

    def overview(self) -> dict[str, Any]: ...

    def status(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None: ...

    def recent(self, experiment_id: str, run: str | None = None) -> list[dict[str, Any]] | None: ...

    def span_rows(
        self,
        experiment_id: str,
        first: int | None = None,
        last: int | None = None,
        ranks: set[int] | None = None,
        run: str | None = None,
    ) -> Iterator[str] | None: ...

    def report(self, experiment_id: str, timeout: float = 60.0, run: str | None = None) -> list[str] | str: ...

    def capture(
        self,
        experiment_id: str,
        reason: str,
        steps: int,
        ranks: frozenset[int] | None = None,
        run: str | None = None,
    ) -> dict[str, Any] | str: ...

    def pending_captures(self, experiment_id: str, process_id: str) -> list[dict[str, Any]]: ...

    def capture_target(self, experiment_id: str, capture_id: str, process_id: str, size: int) -> Path: ...

    def store_capture(self, experiment_id: str, capture_id: str, process_id: str, data: bytes) -> str: ...
