"""Checkpoints: ``torch.save``/``torch.load`` and ``torch.distributed.checkpoint.save``/``load``
as spans with their duration and bytes (``checkpoint/{save,load}_s`` MAX, ``_bytes`` SUM).

Bytes: the file's size for a path, the stream's advance for a file object, the storage
sizes in the returned metadata for DCP saves and the directory's size for DCP loads.
A save nested in another (DCP writes small items with ``torch.save``) is not counted twice,
and in-memory buffers (``io.BytesIO``: RPC and actor messages serialize tensors that way)
are not checkpoints.
"""

from __future__ import annotations

import contextvars
import io
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..core import names as attr
from ..core.errors import report_internal_error
from ..metrics.recording import record_metric
from ..metrics.reduce import Reduce
from ..tracing.tracer import close_span, open_span
from ._base import ModuleInstrumentor, restore, swap

_SUM, _MAX = Reduce.SUM, Reduce.MAX
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("rankscope_checkpoint", default=False)


class CheckpointInstrumentor(ModuleInstrumentor):
    target = "torch"

    def _apply(self, module: ModuleType) -> None:
        self._saved: dict[tuple[Any, str], Any] = {}
        swap(module, "save", _timed("save", module.save, _file_bytes, 1), self._saved)
        swap(module, "load", _timed("load", module.load, _file_bytes, 0), self._saved)
        import wrapt

        wrapt.register_post_import_hook(self._on_dcp, "torch.distributed.checkpoint")

    def _on_dcp(self, dcp: ModuleType) -> None:
        if not self._active or not hasattr(self, "_saved"):
            return
        for name, measure in (("save", _dcp_save_bytes), ("load", _dcp_load_bytes)):
            original = getattr(dcp, name, None)
            if original is not None and (dcp, name) not in self._saved:
                swap(dcp, name, _timed(name, original, measure, None), self._saved)

    def _revert(self) -> None:
        restore(self._saved)


Measure = Callable[[Any, tuple[Any, ...], dict[str, Any], int | None, Any], int]


def _file_bytes(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], before: int | None, result: Any) -> int:
    if isinstance(target, (str, os.PathLike)):
        return os.path.getsize(target) if os.path.isfile(target) else 0
    if before is not None and hasattr(target, "tell"):
        return max(0, int(target.tell()) - before)
    return 0


def _dcp_save_bytes(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], before: int | None, result: Any) -> int:
    storage = getattr(result, "storage_data", None) or {}
    return int(sum(getattr(info, "length", 0) for info in storage.values()))


def _dcp_load_bytes(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], before: int | None, result: Any) -> int:
    path = kwargs.get("checkpoint_id")
    if path is None or not os.path.isdir(path):
        return 0
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())


def _timed(kind: str, original: Any, measure: Measure, position: int | None) -> Any:
    seconds_key, bytes_key = f"checkpoint/{kind}_s", f"checkpoint/{kind}_bytes"
    span_name = f"checkpoint/{kind}"
    argument = "f"

    def checkpoint(*args: Any, **kwargs: Any) -> Any:
        if _inside.get():
            return original(*args, **kwargs)
        target = None
        if position is not None:
            target = args[position] if len(args) > position else kwargs.get(argument)
            if isinstance(target, io.BytesIO):
                return original(*args, **kwargs)
        before = None
        if isinstance(target, io.IOBase) or hasattr(target, "tell"):
            try:
                before = int(target.tell())  # type: ignore[union-attr]
            except (OSError, ValueError):
                before = None
        span = open_span(span_name)
        token = _inside.set(True)
        start = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            if span is not None:
                close_span(span, error=exc)
            raise
        finally:
            _inside.reset(token)
        try:
            seconds = time.perf_counter() - start
            nbytes = measure(target, args, kwargs, before, result)
            record_metric(seconds_key, seconds, _MAX)
            record_metric(bytes_key, nbytes, _SUM)
            if span is not None:
                span.attributes[attr.CHECKPOINT_BYTES] = nbytes  # type: ignore[index]
                close_span(span)
        except Exception as exc:
            report_internal_error(f"checkpoint {kind} instrumentation", exc)
        return result

    checkpoint.__name__ = checkpoint.__qualname__ = getattr(original, "__name__", kind)
    checkpoint.__doc__ = original.__doc__
    checkpoint.__wrapped__ = original  # type: ignore[attr-defined]
    return checkpoint
