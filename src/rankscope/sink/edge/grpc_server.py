"""OTLP/gRPC transport: the three collector services on grpcio's asyncio server, behind the relay
(``edge.front``), handing requests to the sink.

A call waiting for its request costs no thread (grpcio's synchronous server gave each call a
worker that waited for the request's message: eight streams opened and never finished held all
eight and stopped gRPC ingest); decoding and taking a request run on a pool of ``grpc_workers``.

The services are registered with raw-bytes request handling, so an undecodable body is
answered INVALID_ARGUMENT (not INTERNAL) by the sink's edge, which counts what a body costs
before decoding it (``edge.cost``). grpcio inflates gzip itself and
enforces ``max_receive_message_length`` on the inflated message, so oversized and gzip-bomb
requests end as RESOURCE_EXHAUSTED before we see them. Every other refusal is answered from its
kind's row in ``edge.errors.ANSWERS``, as the HTTP side answers it; one worth retrying carries
``RetryInfo`` (without it OTLP clients give RESOURCE_EXHAUSTED up). The bearer token is checked
by ``edge.auth``, as the HTTP side does, and its scope travels with the request's ``Client``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any, NoReturn

import grpc
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_pb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb

from ...otlp.raw import parse_logs, parse_metrics, parse_traces
from .auth import UNAUTHORIZED, Keys
from .backlog import Backlog
from .connections import Counts
from .errors import ANSWERS, Kind, RefusedError
from .front import Front
from .listener import OnExhausted
from .ports import Client, Ingest, Spawn, Transport

_SERVICES = (
    ("opentelemetry.proto.collector.metrics.v1.MetricsService", parse_metrics,
     metrics_pb.ExportMetricsServiceResponse, "export_metrics", "rejected_data_points"),
    ("opentelemetry.proto.collector.trace.v1.TraceService", parse_traces,
     trace_pb.ExportTraceServiceResponse, "export_traces", "rejected_spans"),
    ("opentelemetry.proto.collector.logs.v1.LogsService", parse_logs,
     logs_pb.ExportLogsServiceResponse, "export_logs", "rejected_log_records"),
)  # fmt: skip


def _handler(
    ingest: Ingest,
    backlog: Backlog,
    keys: Keys,
    peer_of: Callable[[str], str],
    pool: futures.Executor,
    parse: Callable[[bytes], Any],
    response_class: type,
    export_name: str,
    rejected_field: str,
) -> Any:
    export = getattr(ingest, export_name)

    def take(body: bytes, client: Client) -> bytes | tuple[Kind, str]:
        """Decode and take one request (on ``pool``: it is the CPU's work): its answer, or why not."""
        try:
            request = parse(body)
        except (DecodeError, ValueError, RecursionError) as exc:
            return Kind.BAD_REQUEST, f"undecodable OTLP request: {exc}"
        try:
            result = export(request, client)
        except RefusedError as exc:
            return exc.kind, str(exc)
        response = response_class()
        if result.rejected:
            setattr(response.partial_success, rejected_field, result.rejected)
            response.partial_success.error_message = result.message
        return bytes(response.SerializeToString())

    async def handle(body: bytes, context: Any) -> bytes:
        scope = keys.scope_of_headers([v for k, v in context.invocation_metadata() if k == "authorization"])
        if scope is None:
            await abort(context, Kind.UNAUTHORIZED, UNAUTHORIZED)
        gone = threading.Event()  # the call was cancelled (the client went away): stop opening runs
        client = Client(peer=peer_of(context.peer()), scope=scope, alive=lambda: not gone.is_set())
        try:
            with backlog.held():  # received whole: a step's grace waits for it (edge.backlog)
                answer = await asyncio.get_running_loop().run_in_executor(pool, take, body, client)
        except asyncio.CancelledError:
            gone.set()  # the taking goes on on its thread, and sees it
            raise
        if isinstance(answer, tuple):
            await abort(context, *answer)
        return answer

    return grpc.unary_unary_rpc_method_handler(handle)  # bytes in, bytes out


async def abort(context: Any, kind: Kind, message: str) -> NoReturn:
    """End the call as ``kind``'s row in ``ANSWERS`` says; a retry hint goes as ``RetryInfo`` both
    where OTLP clients look for it: in ``grpc-status-details-bin`` (Go, the Collector) and in
    ``google.rpc.retryinfo-bin`` (the Python SDK's exporter, rankscope's own senders)."""
    answer = ANSWERS[kind]
    if answer.retry_after is not None:
        hint = RetryInfo(retry_delay=Duration(seconds=answer.retry_after))
        detail = AnyMessage()
        detail.Pack(hint)
        status = Status(code=answer.grpc.value[0], message=message, details=[detail])
        context.set_trailing_metadata(
            (
                ("grpc-status-details-bin", status.SerializeToString()),
                ("google.rpc.retryinfo-bin", hint.SerializeToString()),
            )
        )
    await context.abort(answer.grpc, message)
    raise AssertionError("grpc's abort raises")  # for a context that does not


def start_grpc(
    ingest: Ingest,
    config: Transport,
    port: int,
    spawn: Spawn,
    *,
    counts: Counts | None = None,
    on_exhausted: OnExhausted | None = None,
    backlog: Backlog | None = None,
) -> tuple[Any, int]:
    """Listen on ``config.host:port`` (0: any free port) through the relay (``edge.front``: the
    connection rules), grpcio's asyncio server on a loopback port behind it, both on the relay's
    event loop (a call waiting for its request holds no thread; decoding and taking it run on a
    pool of ``grpc_workers`` threads); ``counts``: where the rules count what they did (the status
    route's ``connections.grpc``); ``backlog``: where a call is held until it is answered
    (``edge.backlog``)."""
    held = backlog or Backlog()
    relayed = max(1, config.max_connections // 3)  # a relayed connection holds three descriptors
    front = Front(
        config.host,
        port,
        max_connections=relayed,
        per_peer=config.per_peer_connections or max(4, relayed // 4),
        header_timeout=config.header_timeout,
        idle_timeout=config.idle_connection_timeout,
        counts=counts,
        on_exhausted=on_exhausted,
    )
    pool = futures.ThreadPoolExecutor(max_workers=config.grpc_workers, thread_name_prefix="rankscope-sink-grpc")
    keys = Keys(config.token, config.tokens, counts.refused_token if counts is not None else None)
    peer_of = relayed_peer_of([front])

    async def serve() -> Any:
        server = grpc.aio.server(options=_options(config, relayed))
        for service, parse, response_class, export_name, rejected_field in _SERVICES:
            handler = _handler(ingest, held, keys, peer_of, pool, parse, response_class, export_name, rejected_field)
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {"Export": handler}),))
        front.upstream_port = server.add_insecure_port("127.0.0.1:0")
        if front.upstream_port == 0:
            raise OSError("rankscope sink: cannot listen for OTLP/gRPC on a loopback port")
        await server.start()
        return server

    server = front.loop.run_until_complete(serve())
    spawn("grpc-front", front.serve)
    return _Stoppable(server, front, pool), front.port


def _options(config: Transport, relayed: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", config.max_body_bytes),
        ("grpc.so_reuseport", 0),
        # a connection that has not finished its HTTP/2 handshake is closed as an HTTP one that
        # has not sent its request head (grpcio's default: 120 s)
        ("grpc.server_handshake_timeout_ms", max(1, int(config.header_timeout * 1000))),
        # and one that finished it but carries no call is closed (GOAWAY) once it has idled as
        # long as an HTTP one may between requests (grpcio's default: never)
        ("grpc.max_connection_idle_ms", max(1, int(config.idle_connection_timeout * 1000))),
        # the relay holds its own to ``relayed`` (making room as the HTTP side does); this bounds
        # what reaches grpcio's loopback port besides
        ("grpc.max_allowed_incoming_connections", relayed + 8),
        # no bound on the calls one connection carries at once (HTTP/2's concurrent streams): a
        # client multiplexing its exports (a gateway, a sender of many ranks) would be refused
        # streams (REFUSED_STREAM, which clients do not retry); a stalled one costs no thread
    ]


def relayed_peer_of(fronts: list[Front]) -> Callable[[str], str]:
    """A call's ``context.peer()`` (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``) as
    its client's host: through the relay's map once the relay (``fronts[0]``) is up."""

    def peer(grpc_peer: str) -> str:
        kind, _, address = grpc_peer.partition(":")
        if kind not in ("ipv4", "ipv6"):
            return grpc_peer
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        if not fronts or not port.isdigit():
            return host
        return fronts[0].peer_of(host, int(port))

    return peer


class _Stoppable:
    def __init__(self, server: Any, front: Front, pool: futures.Executor) -> None:
        self.server = server
        self.front = front
        self.pool = pool

    def stop(self) -> None:
        """No new connection, the calls in progress answered (a second of grace), then the relay."""
        self.front.stop(before=lambda: self.server.stop(grace=1.0))
        self.pool.shutdown(wait=False, cancel_futures=True)
