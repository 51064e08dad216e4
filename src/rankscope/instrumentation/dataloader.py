"""DataLoader: the time the trainer waits for each batch (its data-loading idle time)."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from ..core.errors import report_internal_error
from ..metrics.recording import record_metric
from ..metrics.reduce import Reduce
from ..tracing.spans import now_ns
from ..tracing.tracer import close_span, open_span
from ._base import ModuleInstrumentor, restore, swap

_SUM, _MEAN, _MAX = Reduce.SUM, Reduce.MEAN, Reduce.MAX


class DataLoaderInstrumentor(ModuleInstrumentor):
    """Wraps every DataLoader iterator's ``__next__``: ``dataloader/wait_s``, ``wait_max_s``,
    ``batches`` and a ``dataloader/next`` span per batch."""

    target = "torch.utils.data.dataloader"

    def _apply(self, module: ModuleType) -> None:
        self._saved: dict[tuple[Any, str], Any] = {}
        iterator = module._BaseDataLoaderIter
        original = iterator.__next__

        def __next__(self: Any) -> Any:  # noqa: N807 - the method it replaces
            span = open_span("dataloader/next")
            start = time.perf_counter()
            try:
                batch = original(self)
            except StopIteration:
                raise
            except BaseException as exc:
                if span is not None:
                    close_span(span, now_ns(), exc)
                raise
            try:
                seconds = time.perf_counter() - start
                record_metric("dataloader/wait_s", seconds, _MEAN)
                record_metric("dataloader/wait_max_s", seconds, _MAX)
                record_metric("dataloader/batches", 1, _SUM)
                if span is not None:
                    close_span(span)
            except Exception as exc:
                report_internal_error("DataLoader instrumentation", exc)
            return batch

        swap(iterator, "__next__", __next__, self._saved)

    def _revert(self) -> None:
        restore(self._saved)
