"""Why the sink refuses a request, and what each reason is answered on HTTP and on gRPC: one table.

Every refusal carries a ``Kind``; ``ANSWERS`` alone turns it into an HTTP status, a gRPC code
(also the ``google.rpc.Status`` code of an HTTP error body) and a retry hint, so both transports
answer a reason alike and no status is ever chosen by reading a message (which may hold a
client's experiment id). The pairs follow the OTel Collector's OTLP receiver and OTLP's
"Failures" rules: a refusal a client should retry is 503/UNAVAILABLE, or, when it is throttling,
429/RESOURCE_EXHAUSTED; both carry ``Retry-After`` (HTTP) or ``RetryInfo`` (gRPC), without which
OTLP clients treat RESOURCE_EXHAUSTED as final. Everything else is the client's to fix.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc


class Kind(enum.Enum):
    """A reason the sink refuses a request."""

    BAD_REQUEST = "bad_request"
    """An undecodable OTLP body, a bad control body or query."""
    UNAUTHORIZED = "unauthorized"
    """No token, or a wrong one."""
    NO_ROUTE = "no_route"
    """Nothing is served at this path."""
    METHOD_NOT_ALLOWED = "method_not_allowed"
    """The path is served, not with this method."""
    NOT_FOUND = "not_found"
    """No such experiment, run, process or capture (or not in the token's scope)."""
    BODY_TIMEOUT = "body_timeout"
    """The body did not arrive in time (a trickled body would hold its connection)."""
    CONFLICT = "conflict"
    """The run cannot do this in its present state: a report with no view open, none that writes
    reports, or not written in time."""
    LENGTH_REQUIRED = "length_required"
    """A capture file without a Content-Length (checked before its body is read)."""
    TOO_LARGE = "too_large"
    """A body over ``max_body_bytes``, as sent or inflated: sent again it is refused again."""
    COSTLY = "costly"
    """A request over a per-request bound (``checked.Limits``: its points, spans or log records,
    resources or experiments; ``edge.cost``), refused whole before any of it was decoded or taken:
    sent again it is refused again. 400/INVALID_ARGUMENT, not 413/RESOURCE_EXHAUSTED: OTLP's Python
    gRPC exporter retries RESOURCE_EXHAUSTED whatever the server says, and no OTLP client retries
    INVALID_ARGUMENT."""
    UNSUPPORTED_MEDIA = "unsupported_media"
    """A content type or encoding the sink does not read."""
    RATE_LIMITED = "rate_limited"
    """A capture over its rate limits (asked too soon, too many open): asking again soon will not do."""
    BUSY = "busy"
    """This experiment's report (or too many others) is being written: ask again shortly."""
    CAPACITY = "capacity"
    """More calls in flight than ``max_in_flight``, or a request whose points do not fit in what
    ``max_points_in_flight`` leaves now (``edge.gate``, before any of it is decoded): the sink
    throttles, retry shortly."""
    OPENING = "opening"
    """A request that would open more new runs than ``Limits.max_new_runs``: the first were opened
    and, of a metrics request, their data taken (known by its digest on the retry, not merged
    twice); a traces or logs request took nothing (spans and log records have no digest: its runs
    are opened before any of it is taken). The retry opens the next."""
    CLIENT_GONE = "client_gone"
    """The client went away (closed its connection, cancelled its call) while its request's runs were
    being opened: the sink opened no more. Nobody reads the answer; the client's retry is recognized
    (a traces or logs request took nothing)."""
    CLOSING = "closing"
    """The run was closed between being found and taking the data; a retry reopens it."""
    NOT_DURABLE = "not_durable"
    """The write-ahead log could not make the data durable."""
    STOPPING = "stopping"
    """The sink is stopping."""
    OUT_OF_DESCRIPTORS = "out_of_descriptors"
    """No file descriptor for a new connection (answered at accept, ``edge.listener``)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """How one ``Kind`` is answered."""

    http: int
    grpc: grpc.StatusCode
    retry_after: int | None = None
    """Seconds to wait before retrying (``Retry-After``, ``RetryInfo``); None: retrying will not help."""
    close: bool = False
    """HTTP: close the connection after answering (its body is unread, or its peer unknown)."""


_CODE = grpc.StatusCode
ANSWERS: dict[Kind, Answer] = {
    Kind.BAD_REQUEST: Answer(400, _CODE.INVALID_ARGUMENT),
    Kind.UNAUTHORIZED: Answer(401, _CODE.UNAUTHENTICATED, close=True),
    Kind.NO_ROUTE: Answer(404, _CODE.UNIMPLEMENTED),
    Kind.METHOD_NOT_ALLOWED: Answer(405, _CODE.UNIMPLEMENTED),
    Kind.NOT_FOUND: Answer(404, _CODE.NOT_FOUND),
    Kind.BODY_TIMEOUT: Answer(408, _CODE.DEADLINE_EXCEEDED, close=True),
    Kind.CONFLICT: Answer(409, _CODE.FAILED_PRECONDITION),
    Kind.LENGTH_REQUIRED: Answer(411, _CODE.INVALID_ARGUMENT),
    Kind.TOO_LARGE: Answer(413, _CODE.RESOURCE_EXHAUSTED, close=True),
    Kind.COSTLY: Answer(400, _CODE.INVALID_ARGUMENT),
    Kind.UNSUPPORTED_MEDIA: Answer(415, _CODE.INVALID_ARGUMENT),
    Kind.RATE_LIMITED: Answer(429, _CODE.RESOURCE_EXHAUSTED),
    Kind.BUSY: Answer(429, _CODE.RESOURCE_EXHAUSTED, retry_after=2),
    Kind.CAPACITY: Answer(429, _CODE.RESOURCE_EXHAUSTED, retry_after=1),
    Kind.OPENING: Answer(429, _CODE.RESOURCE_EXHAUSTED, retry_after=1),
    Kind.CLIENT_GONE: Answer(499, _CODE.CANCELLED, close=True),
    Kind.CLOSING: Answer(503, _CODE.UNAVAILABLE, retry_after=1),
    Kind.NOT_DURABLE: Answer(503, _CODE.UNAVAILABLE, retry_after=1),
    Kind.STOPPING: Answer(503, _CODE.UNAVAILABLE, retry_after=1),
    Kind.OUT_OF_DESCRIPTORS: Answer(503, _CODE.UNAVAILABLE, retry_after=1),
}
"""Every ``Kind``'s answer on both transports (``tests/unit/test_sink_errors.py`` fails on a kind without one)."""


@dataclass(frozen=True, slots=True)
class HttpError(Exception):
    """A request refused at the HTTP edge: its kind chooses the answer, its message explains it."""

    kind: Kind
    message: str

    @property
    def status(self) -> int:
        return ANSWERS[self.kind].http


class RefusedError(Exception):
    """A call the sink refuses whole, its kind saying why (COSTLY, BAD_REQUEST, ...).

    Raised by ``Sink.export_*`` and capture uploads, answered by the transports from ``ANSWERS``;
    it lives in the edge, so the transports never import the service."""

    def __init__(self, kind: Kind, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def retry_after(self) -> int | None:
        return ANSWERS[self.kind].retry_after


class OverloadedError(RefusedError):
    """The sink cannot take this now, a retry may (its kind says why: CAPACITY, CLOSING, ...)."""


class Refusal(str):
    """A query's "no" (``edge.ports.Control``): the text for people, the kind for the status.

    A ``str``, so callers that show an answer (``rankscope run``) keep working."""

    kind: Kind

    def __new__(cls, kind: Kind, text: str) -> Refusal:
        refusal = super().__new__(cls, text)
        refusal.kind = kind
        return refusal
