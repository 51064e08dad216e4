"""torchelastic bridge: ``torch.distributed.elastic.metrics`` data into rankscope.

``put_metric(name, value, group)`` and ``@prof`` values become ``torchelastic/{group}/{name}``
in the step in progress, with the process Resource's run id (``rankscope.experiment.id``
from ``TORCHELASTIC_RUN_ID``) and restart count (``rankscope.experiment.attempt`` from
``TORCHELASTIC_RESTART_COUNT``). Counts (``.success``, ``.failure``, ``.count``) are summed,
other values averaged.

    import torch.distributed.elastic.metrics as metrics
    metrics.configure(RankscopeMetricHandler(), group="my_app")

The instrumentor configures it as the default handler in torchrun workers (not in the
elastic agent, which never closes steps).
"""

from __future__ import annotations

import os
import re
from types import ModuleType
from typing import Any

from ..core.errors import report_internal_error
from ..metrics.recording import record_metric
from ..metrics.reduce import Reduce
from ._base import ModuleInstrumentor

_COUNTS = (".success", ".failure", ".count")
_INVALID = re.compile(r"[^-_./a-zA-Z0-9]")
_keys: dict[tuple[str, str], tuple[str, Reduce]] = {}


def _key(group: str, name: str) -> tuple[str, Reduce]:
    found = _keys.get((group, name))
    if found is None:
        key = _INVALID.sub("_", f"torchelastic/{group}/{name}")
        found = _keys[(group, name)] = (key, Reduce.SUM if name.endswith(_COUNTS) else Reduce.MEAN)
    return found


class RankscopeMetricHandler:
    """A ``MetricHandler`` (duck-typed: torchelastic only calls ``emit``) that records into rankscope."""

    def emit(self, metric_data: Any) -> None:
        try:
            key, reduce = _key(str(metric_data.group_name), str(metric_data.name))
            record_metric(key, float(metric_data.value), reduce)
        except Exception as exc:
            report_internal_error("torchelastic metric handler", exc)


class TorchElasticInstrumentor(ModuleInstrumentor):
    target = "torch.distributed.elastic.metrics.api"

    def _apply(self, module: ModuleType) -> None:
        self._previous = None
        if "RANK" not in os.environ and not self.options.get("force", False):
            return  # the elastic agent (or a plain script): leave its handlers alone
        self._previous = module._default_metrics_handler
        module.configure(_handler_class(module)())
        self._module = module

    def _revert(self) -> None:
        if self._previous is not None:
            self._module.configure(self._previous)
            self._previous = None


def _handler_class(module: ModuleType) -> type:
    """``RankscopeMetricHandler`` as a real subclass of torchelastic's ``MetricHandler``."""
    return type("RankscopeMetricHandler", (RankscopeMetricHandler, module.MetricHandler), {})
