"""rankscope as an OpenTelemetry distribution: ``opentelemetry-instrument python train.py``.

``opentelemetry-instrument`` (and ``rankscope run``) loads, in every Python process of the
job, the distro (``opentelemetry_distro`` entry point ``rankscope``), then the configurator
(``opentelemetry_configurator``), then every ``opentelemetry_instrumentor`` not listed in
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``. The distro only ``setdefault``s environment
variables; the configurator installs rankscope's global tracer provider. rankscope itself
initializes at the first instrumented event of a process (its identity read from the
environment then), so a launcher that never trains (the torchrun agent) reports nothing.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]

from ..export._otel_sdk import ConfiguratorBase

DEFAULTS = {
    # Pick rankscope's configurator even when another one (e.g. the SDK's) is installed.
    "OTEL_PYTHON_CONFIGURATOR": "rankscope",
    # rankscope exports metrics and spans itself; the SDK's own exporters stay off.
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
}


class RankscopeDistro(BaseDistro):  # type: ignore[misc]
    """Sets rankscope's defaults (an explicit environment variable always wins)."""

    def _configure(self, **kwargs: Any) -> None:
        for name, value in DEFAULTS.items():
            os.environ.setdefault(name, value)


class RankscopeConfigurator(ConfiguratorBase):  # type: ignore[misc]  # the SDK's _BaseConfigurator
    """Installs rankscope's tracer provider, so other instrumentations' spans join each step's trace."""

    def _configure(self, **kwargs: Any) -> None:
        from opentelemetry.sdk.resources import Resource

        from ..core.settings import resolve
        from ..tracing.provider import install_tracer_provider

        if resolve("disable"):
            return
        # Spans are exported under the process Resource rankscope builds at init; this one is unused.
        install_tracer_provider(Resource.get_empty())


__all__ = ["DEFAULTS", "RankscopeConfigurator", "RankscopeDistro"]
