"""The OTel SDK tracer provider rankscope installs, so a user's own spans travel with its spans.

Installed as the global provider at the first ``init`` unless the program already set one
(then that provider keeps its exporters, and its spans still nest under rankscope's through
the shared OTel context). Finished spans join the process's span buffer under the
process Resource, whichever runtime is current (``init`` may run again).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from ..core import runtime as _slot
from .tracer import tracing_of

_installed: TracerProvider | None = None


class _ToCurrentRuntime(SpanProcessor):
    def on_end(self, span: Any) -> None:
        runtime = _slot.current
        if runtime is not None:
            tracing_of(runtime).processor.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def install_tracer_provider(resource: Resource) -> TracerProvider | None:
    """Make rankscope's provider the global one if nobody else set a provider first."""
    global _installed
    if _installed is not None:
        return _installed
    current = otel_trace.get_tracer_provider()
    if not isinstance(current, otel_trace.ProxyTracerProvider):
        return None
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(_ToCurrentRuntime())
    otel_trace.set_tracer_provider(provider)
    _installed = provider
    return provider
