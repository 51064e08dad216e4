"""Every private OpenTelemetry name rankscope relies on, version-checked in one place.

rankscope hands its own protobuf requests to the SDK exporters' transports, one attempt at a
time (``senders`` says why), and plugs into two SDK extension points whose names are private.
None of that is public API, so it all lives here; nothing else in rankscope touches a private
OpenTelemetry name (a test locks that in). Read from opentelemetry-sdk,
opentelemetry-exporter-otlp-proto-grpc and -http 1.45.2, and the opentelemetry-exporter-otlp-common
0.66b2 those exporters pin:

- ``opentelemetry.sdk.metrics._Gauge``: the synchronous gauge class, for the export thread's
  reader's temporality table (``SdkGauge``).
- ``opentelemetry.sdk.metrics.export.MetricReader._receive_metrics``: the hook the export
  thread's pull reader implements.
- ``opentelemetry.sdk._configuration._BaseConfigurator``: the base of rankscope's configurator
  (``rankscope.instrumentation.distro``; ``ConfiguratorBase``).
- ``opentelemetry.exporter.otlp.proto.{grpc,http}._log_exporter``: the OTLP log exporters (streamed
  raw values go as log records).
- On a gRPC exporter: ``_channel``, ``_headers``, ``_timeout``, ``_shutdown``,
  ``_retryable_error_codes`` (``grpc_export``: rankscope's requests are bytes already, so they go
  as they are through a call of the service's ``Export`` method on the exporter's channel, with
  the exporter's headers, compression and TLS).
- On an HTTP exporter: ``_client`` and ``_shutdown``; on that client (``_OTLPHTTPClient``):
  ``_timeout``, ``_compress(data)``, ``_submit(data, timeout)`` (``http_post``), ``_endpoint`` and
  ``_transport`` (``keep_alive``: a plain ``http://`` endpoint's requests go through ``kept_alive``),
  and on the SDK's ``requests`` transport ``_session`` (one a credential provider made keeps it).
- ``opentelemetry.exporter.http.transport._base.BaseHTTPTransport`` and ``BaseHTTPResult``
  (opentelemetry-exporter-http-transport 0.66b2): the transport interface ``kept_alive`` implements.

What is checked when: at import, that each package's version is in the range rankscope requires
(``SUPPORTED``, the ``~=1.45`` of its dependencies) and that every name on a module or class
resolves (``PROBLEMS``); the names on an exporter object exist only once one is built, so
``make_exporter`` checks them as each exporter is made (at ``init`` for an explicit endpoint, at
the first export for the embedded sink).

A problem is reported as an internal error (``report_internal_error``: a warning naming the
package, its installed version, the missing name and what turns off; loud in rankscope's own
tests) when the senders are made at ``init`` (``report_problems``), not raised as an ImportError:
an OpenTelemetry upgrade must not stop a training job from starting. Only what needs the name
turns off: an exporter that lacks its transport refuses every send with the same message (counted
as dropped, never retried), a missing log exporter stops streamed values, a missing ``_Gauge`` or
``_BaseConfigurator`` falls back to a stand-in. ``tests/integration/test_otel_sdk_compat.py`` resolves every
name and sends one request through each exporter path to a real receiver.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Collection
from importlib import import_module, metadata
from typing import Any, Literal

import requests
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.metrics import ObservableGauge

from ..core.errors import report_internal_error

Protocol = Literal["grpc", "http/protobuf"]
Signal = Literal["metrics", "logs", "spans"]

SDK = "opentelemetry-sdk"
GRPC = "opentelemetry-exporter-otlp-proto-grpc"
HTTP = "opentelemetry-exporter-otlp-proto-http"
HTTP_CLIENT = "opentelemetry-exporter-otlp-common"
HTTP_TRANSPORT = "opentelemetry-exporter-http-transport"

READ_FROM = {SDK: "1.45.2", GRPC: "1.45.2", HTTP: "1.45.2", HTTP_CLIENT: "0.66b2", HTTP_TRANSPORT: "0.66b2"}
SUPPORTED: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    SDK: ((1, 45), (2, 0)),
    GRPC: ((1, 45), (2, 0)),
    HTTP: ((1, 45), (2, 0)),
    HTTP_CLIENT: ((0, 66), (1, 0)),
    HTTP_TRANSPORT: ((0, 66), (1, 0)),
}
"""(lowest, below) as (major, minor) per package: rankscope's own ``~=1.45``; the client package is
the one the 1.45 exporters pin, and older ones lack the client altogether."""

_SENDS_FAIL = "{what} cannot be sent over {protocol}: every send is refused and counted as dropped"
_KEEPS_SDK_TRANSPORT = "OTLP/HTTP goes through the SDK's own transport (requests: ~1 ms more CPU a request)"
_STATIC = (
    # (key, package, module, attribute path, what turns off without it)
    (
        "gauge",
        SDK,
        "opentelemetry.sdk.metrics",
        "_Gauge",
        "synchronous gauges of other libraries are collected with the SDK's default (cumulative) temporality",
    ),
    (
        "receive",
        SDK,
        "opentelemetry.sdk.metrics.export",
        "MetricReader._receive_metrics",
        "the export thread's reader of the SDK MeterProvider no longer implements the SDK's collection hook",
    ),
    (
        "configurator",
        SDK,
        "opentelemetry.sdk._configuration",
        "_BaseConfigurator",
        "rankscope's configurator for opentelemetry-instrument stands on a minimal stand-in base class",
    ),
    (
        "grpc logs",
        GRPC,
        "opentelemetry.exporter.otlp.proto.grpc._log_exporter",
        "OTLPLogExporter",
        _SENDS_FAIL.format(what="streamed values (OTLP logs)", protocol="grpc"),
    ),
    (
        "http logs",
        HTTP,
        "opentelemetry.exporter.otlp.proto.http._log_exporter",
        "OTLPLogExporter",
        _SENDS_FAIL.format(what="streamed values (OTLP logs)", protocol="http/protobuf"),
    ),
    (
        "http transport",
        HTTP_TRANSPORT,
        "opentelemetry.exporter.http.transport._base",
        "BaseHTTPTransport",
        _KEEPS_SDK_TRANSPORT,
    ),
    (
        "http result",
        HTTP_TRANSPORT,
        "opentelemetry.exporter.http.transport._base",
        "BaseHTTPResult",
        _KEEPS_SDK_TRANSPORT,
    ),
)
_GRPC_ATTRIBUTES = ("_channel", "_headers", "_timeout", "_shutdown", "_retryable_error_codes")
GRPC_METHODS: dict[str, str] = {
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "spans": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
}
"""The OTLP services' Export methods (the proto files' package, service and method names)."""
_HTTP_ATTRIBUTES = ("_client", "_shutdown")
_HTTP_CLIENT_METHODS = (("_compress", "(data)", (b"",)), ("_submit", "(data, timeout)", (b"", 1.0)))


class OtelSdkMismatchError(RuntimeError):
    """An OpenTelemetry private name rankscope relies on is missing or changed."""


def installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _mismatch(package: str, name: str, consequence: str) -> str:
    version, read = installed(package), READ_FROM[package]
    return (
        f"{package} {version} has no {name} (rankscope read it from {read}); {consequence}. "
        f"Install {package}=={read} or a rankscope release that supports {version}"
    )


def _version_problems() -> list[str]:
    problems = []
    for package, (lowest, below) in SUPPORTED.items():
        version = installed(package)
        found = re.match(r"(\d+)\.(\d+)", version)
        if found is None or not lowest <= (int(found[1]), int(found[2])) < below:
            spec = f">={lowest[0]}.{lowest[1]},<{below[0]}.{below[1]}"
            problems.append(
                f"{package} {version} is outside the versions whose private names rankscope was written "
                f"against ({spec}, read from {READ_FROM[package]}); install {package}{spec}"
            )
    return problems


def check() -> tuple[dict[str, Any], list[str]]:
    """Resolve every private name that lives on a module or class: (found by key, problems)."""
    found: dict[str, Any] = {}
    problems = _version_problems()
    for key, package, module, path, consequence in _STATIC:
        try:
            value: Any = import_module(module)
            for part in path.split("."):
                value = getattr(value, part)
        except (ImportError, AttributeError):
            problems.append(_mismatch(package, f"{module}.{path}", consequence))
            continue
        found[key] = value
    return found, problems


class _StandInTransport:
    """``BaseHTTPTransport``'s place when the SDK's has moved (then ``keep_alive`` uses none)."""


class _StandInResult:
    """``BaseHTTPResult``'s place when the SDK's has moved."""


class _StandInConfigurator:
    """``_BaseConfigurator``'s contract, used only when the SDK's has moved."""

    def configure(self, **kwargs: Any) -> None:
        self._configure(**kwargs)

    def _configure(self, **kwargs: Any) -> None:
        raise NotImplementedError


_found, PROBLEMS = check()
SdkGauge: type = _found.get("gauge", ObservableGauge)
"""The SDK's synchronous gauge class (ObservableGauge stands in: a repeated key is harmless there)."""
ConfiguratorBase: type = _found.get("configurator", _StandInConfigurator)
HttpTransportBase: type = _found.get("http transport", _StandInTransport)
"""The SDK's HTTP transport interface (``kept_alive.KeptAlive`` implements it)."""
HttpResultBase: type = _found.get("http result", _StandInResult)
_EXPORTERS: dict[tuple[str, str], type | None] = {
    ("grpc", "metrics"): GrpcMetricExporter,
    ("grpc", "spans"): GrpcSpanExporter,
    ("grpc", "logs"): _found.get("grpc logs"),
    ("http/protobuf", "metrics"): HttpMetricExporter,
    ("http/protobuf", "spans"): HttpSpanExporter,
    ("http/protobuf", "logs"): _found.get("http logs"),
}
_reported = False


def report_problems() -> None:
    """Report what the import-time check found, once per process (called as the senders are made)."""
    global _reported
    if not _reported:
        _reported = True
        for problem in PROBLEMS:
            report_internal_error("OpenTelemetry SDK compatibility", OtelSdkMismatchError(problem))


def make_exporter(protocol: Protocol, signal: Signal, **kwargs: Any) -> Any:
    """The SDK's OTLP exporter of ``signal`` over ``protocol``, its private transport checked.

    Raises ``OtelSdkMismatchError`` naming the package, its version and the missing name.
    """
    what = _SENDS_FAIL.format(what=f"OTLP {signal}", protocol=protocol)
    exporter_class = _EXPORTERS[(protocol, signal)]
    if exporter_class is None:
        package = GRPC if protocol == "grpc" else HTTP
        raise OtelSdkMismatchError(_mismatch(package, f"{signal} exporter (its _log_exporter module)", what))
    exporter = exporter_class(**kwargs)
    problem = _transport_problem(exporter, protocol, what)
    if problem is not None:
        exporter.shutdown()
        raise OtelSdkMismatchError(problem)
    return exporter


def _transport_problem(exporter: Any, protocol: str, what: str) -> str | None:
    owner = type(exporter).__name__
    if protocol == "grpc":
        for name in _GRPC_ATTRIBUTES:
            if not hasattr(exporter, name):
                return _mismatch(GRPC, f"{owner}().{name}", what)
        if not callable(getattr(exporter._channel, "unary_unary", None)):
            return _mismatch(GRPC, f"{owner}()._channel.unary_unary", what)
        return None
    for name in _HTTP_ATTRIBUTES:
        if not hasattr(exporter, name):
            return _mismatch(HTTP, f"{owner}().{name}", what)
    client = exporter._client
    client_name = type(client).__name__
    if not hasattr(client, "_timeout"):
        return _mismatch(HTTP_CLIENT, f"{client_name}()._timeout", what)
    for name, shape, arguments in _HTTP_CLIENT_METHODS:
        try:
            inspect.signature(getattr(client, name)).bind(*arguments)
        except (AttributeError, TypeError, ValueError):
            return _mismatch(HTTP_CLIENT, f"{client_name}.{name}{shape}", what)
    return None


_CREDENTIAL_PROVIDERS = tuple(
    f"OTEL_PYTHON_EXPORTER_OTLP_HTTP_{signal}CREDENTIAL_PROVIDER" for signal in ("", "LOGS_", "TRACES_", "METRICS_")
)
"""The SDK's variables naming a function that makes the HTTP exporters' ``requests.Session``."""
_SESSION_SETTINGS = ("headers", "auth", "proxies", "hooks", "params", "verify", "cert", "trust_env", "max_redirects")


def _as_made(session: Any) -> bool:
    """Whether ``session`` is a ``requests.Session`` as the SDK makes one when given none: nothing of its
    own (headers, auth, proxies, hooks, cookies, mounted adapters) that ``http.client`` would not send."""
    if type(session) is not requests.Session:
        return False
    with requests.Session() as fresh:
        return (
            all(getattr(session, name, None) == getattr(fresh, name) for name in _SESSION_SETTINGS)
            and not session.cookies
            and {prefix: type(a) for prefix, a in session.adapters.items()}
            == {prefix: type(a) for prefix, a in fresh.adapters.items()}
        )


def keep_alive(exporter: Any, transport: Any, takes: Callable[[str], bool]) -> bool:
    """Send an HTTP exporter's requests through ``transport`` when ``takes`` its endpoint (the URL the
    SDK resolved: an argument or its variables); whether it was swapped."""
    client = exporter._client
    if HttpTransportBase is _StandInTransport or not isinstance(getattr(client, "_transport", None), HttpTransportBase):
        return False
    if not takes(str(getattr(client, "_endpoint", ""))):
        return False
    session = getattr(client._transport, "_session", None)  # the SDK's requests transport's
    if any(os.environ.get(name) for name in _CREDENTIAL_PROVIDERS) or (session is not None and not _as_made(session)):
        return False  # a credential provider's or the user's own session: its headers, auth, hooks go with it
    old, client._transport = client._transport, transport
    old.close()
    return True


def grpc_export(exporter: Any, signal: Signal, payload: bytes, timeout: float | None) -> bytes | None:
    """One ``Export`` call of a serialized request, with one deadline (at most the exporter's), on the
    exporter's channel with its headers: the serialized response, or None when the exporter is shut
    down. Raises ``grpc.RpcError`` as a stub does.
    """
    if exporter._shutdown or exporter._channel is None:
        return None
    channel = exporter._channel
    calls = exporter.__dict__.setdefault("_rankscope_calls", {})
    found = calls.get(signal)
    if found is None or found[0] is not channel:  # first use, or a channel the SDK has made anew
        # No serializers: bytes go as they are, and the response comes back as bytes.
        found = calls[signal] = (channel, channel.unary_unary(GRPC_METHODS[signal]))
    call = found[1]
    deadline = exporter._timeout if timeout is None else max(0.001, min(timeout, exporter._timeout))
    answer = call(payload, metadata=exporter._headers, timeout=deadline)
    return answer if isinstance(answer, bytes) else b""


def grpc_retryable(exporter: Any) -> Collection[Any]:
    """The gRPC status codes the exporter retries (``OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES``)."""
    return exporter._retryable_error_codes  # type: ignore[no-any-return]


def http_post(exporter: Any, payload: bytes, timeout: float | None) -> Any | None:
    """One POST with one deadline (at most the exporter's) through the exporter's HTTP client, its
    retry loop unused: the transport's result (``status_code``, ``reason``, ``error``, ``headers()``),
    or None when the exporter is shut down.
    """
    if exporter._shutdown:
        return None
    client = exporter._client
    deadline = client._timeout if timeout is None else max(0.001, min(timeout, client._timeout))
    return client._submit(client._compress(payload), deadline)
