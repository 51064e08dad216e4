"""torch.distributed collectives: duration, bytes, op and process-group size, per call.

Each wrapped call records ``comm/{op}/duration_s`` (MEAN), ``duration_max_s`` (MAX),
``bytes`` (SUM, the input tensors) and ``calls`` (SUM), and a ``comm/{op}`` span. Async
work (``async_op=True``) is measured at completion through its future, not at launch. On
CUDA tensors the duration comes from CUDA events recorded on the caller's stream (the
second one from the work's future callback, which runs ordered after the collective), so
nothing waits on the host.

Covers the Python API (user code, FSDP2's ``all_gather_single`` and ``reduce_scatter_single``,
torchtitan's loss averaging) and DDP's gradient all-reduces, which ``tracing.ddp`` routes through
``dist.all_reduce``. A collective that calls another (``all_gather_into_tensor`` is
``all_gather_single`` in torch 2.15) is one span: the inner call runs unwrapped.

Two paths install the wrappers, one set per process whichever comes first: ``rs.init``
(``lifecycle.assemble``, an import the layering contracts check) and the ``torch_distributed``
instrumentor that ``opentelemetry-instrument`` loads (``instrumentation.distributed``).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from ..core import names as attr
from ..core import runtime
from ..core.errors import report_internal_error
from ..core.patching import restore, swap
from ..metrics.recording import defer_gpu_duration, record_metric
from ..metrics.reduce import Reduce
from .spans import now_ns
from .tracer import close_span, current_gpu_timer, open_span

_SUM, _MEAN, _MAX = Reduce.SUM, Reduce.MEAN, Reduce.MAX

# op -> position of its input tensor(s) among the positional arguments (None: no tensor)
OPS: dict[str, int | None] = {
    "all_reduce": 0,
    "broadcast": 0,
    "reduce": 0,
    "all_gather": 1,
    "all_gather_into_tensor": 1,
    "all_gather_single": 1,
    "reduce_scatter": 1,
    "reduce_scatter_tensor": 1,
    "reduce_scatter_single": 1,
    "all_to_all": 1,
    "all_to_all_single": 1,
    "gather": 0,
    "scatter": 1,
    "send": 0,
    "recv": 0,
    "barrier": None,
}
_INPUT_KWARGS = ("tensor", "input_tensor", "input", "input_tensor_list", "scatter_list")
_MARK = "_rankscope_collective"
"""Set on every wrapper: a collective already wrapped is never wrapped again."""

_saved: dict[tuple[Any, str], Any] = {}
"""The originals the installed wrappers replaced (empty: not installed)."""
_lock = threading.Lock()


class _Inside(threading.local):
    depth = 0
    """Wrapped collectives running on this thread (a nested one is not a span of its own)."""
    source = ""
    """Who calls the collectives on this thread now ("ddp": a DDP bucket's hook, ``tracing.ddp``)."""


_inside = _Inside()


def install(dist: ModuleType) -> bool:
    """Wrap the collectives in ``OPS`` on ``dist`` (``torch.distributed``) and its
    ``distributed_c10d``. False when nothing was wrapped: they already are in this process
    (by either path) or this torch has no distributed support."""
    with _lock:
        if _saved or not dist.is_available():
            return False
        c10d = dist.distributed_c10d
        for op, position in OPS.items():
            original = getattr(c10d, op, None)
            if original is None or getattr(original, _MARK, False):
                continue
            wrapped = _wrap(op, position, _group_position(original), original, dist)
            for owner in (dist, c10d):
                if getattr(owner, op, None) is original:
                    swap(owner, op, wrapped, _saved)
        return bool(_saved)


@contextlib.contextmanager
def called_by(source: str) -> Iterator[None]:
    """The collectives called on this thread meanwhile are ``source``'s (their spans say so)."""
    before, _inside.source = _inside.source, source
    try:
        yield
    finally:
        _inside.source = before


def uninstall() -> None:
    """Put back the originals ``install`` replaced (whichever path installed them)."""
    with _lock:
        restore(_saved)


def installed() -> bool:
    """Whether this process's collectives are wrapped."""
    return bool(_saved)


def _nbytes(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    numel = getattr(value, "numel", None)
    return int(numel() * value.element_size()) if numel is not None else 0


def _first_tensor(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


_groups: dict[int, tuple[int, str]] = {}


def _group(dist: Any, group: Any) -> tuple[int, str]:
    """(size, name) of ``group`` (None: the default group). The name is the same on every member
    (torch names groups in the order they are made), so the sink matches each member's k-th
    collective of the group in a step."""
    key = id(group)
    found = _groups.get(key)
    if found is None:
        size = int(dist.get_world_size(group))
        pg = group if group is not None else getattr(dist.distributed_c10d, "_get_default_group", lambda: None)()
        name = str(getattr(pg, "group_name", "") or f"size{size}")
        found = _groups[key] = (size, name)
    return found


def _group_position(original: Any) -> int | None:
    """Where ``group`` sits among ``original``'s positional parameters (``dist.barrier(pg)``)."""
    try:
        names = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("group") if "group" in names else None


def _wrap(op: str, position: int | None, group_at: int | None, original: Any, dist: Any) -> Any:
    keys = (f"comm/{op}/duration_s", f"comm/{op}/duration_max_s", f"comm/{op}/bytes", f"comm/{op}/calls")
    span_name = f"comm/{op}"

    def collective(*args: Any, **kwargs: Any) -> Any:
        if runtime.ended or _inside.depth:  # after rs.shutdown(); or inside another
            return original(*args, **kwargs)
        try:
            tensors = None
            if position is not None:
                if len(args) > position:
                    tensors = args[position]
                else:
                    tensors = next((kwargs[k] for k in _INPUT_KWARGS if k in kwargs), None)
            first = _first_tensor(tensors)
            gpu = current_gpu_timer() if first is not None and getattr(first, "is_cuda", False) else None
            start_mark = gpu.mark() if gpu is not None else None
            nbytes = _nbytes(tensors)
            pg = kwargs.get("group", args[group_at] if group_at is not None and len(args) > group_at else None)
            size, group = _group(dist, pg)
            attributes = {
                attr.COMM_OP: op,
                attr.COMM_BYTES: nbytes,
                attr.COMM_GROUP_SIZE: size,
                attr.COMM_GROUP: group,
                attr.COMM_ASYNC: bool(kwargs.get("async_op", False)),
            }
            if _inside.source:
                attributes[attr.COMM_SOURCE] = _inside.source
            span = open_span(span_name, attributes)
            start = now_ns()
        except Exception as exc:
            report_internal_error(f"collective {op} instrumentation", exc)
            return original(*args, **kwargs)
        _inside.depth = 1
        try:
            work = original(*args, **kwargs)
        finally:
            _inside.depth = 0
        done = _Done(keys, nbytes, span, start, gpu, start_mark)
        if work is not None and kwargs.get("async_op", False):
            try:
                work.get_future().then(done.completed)
            except Exception:  # a backend without futures: measured at launch
                done.completed(None)
        else:
            done.completed(None)
        return work

    collective.__name__ = collective.__qualname__ = op
    collective.__doc__ = original.__doc__
    collective.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(collective, _MARK, True)
    return collective


class _Done:
    __slots__ = ("gpu", "keys", "nbytes", "span", "start", "start_mark")

    def __init__(self, keys: tuple[str, ...], nbytes: int, span: Any, start: int, gpu: Any, start_mark: Any) -> None:
        self.keys, self.nbytes, self.span, self.start, self.gpu, self.start_mark = (
            keys,
            nbytes,
            span,
            start,
            gpu,
            start_mark,
        )

    def completed(self, future: Any) -> None:
        """The collective finished (sync: returned; async: its future completed)."""
        try:
            end = now_ns()
            avg_key, max_key, bytes_key, calls_key = self.keys
            record_metric(bytes_key, self.nbytes, _SUM)
            record_metric(calls_key, 1, _SUM)
            gpu = self.gpu
            end_mark = gpu.mark() if gpu is not None else None
            if gpu is not None and end_mark is not None and self.start_mark is not None:
                defer_gpu_duration(avg_key, max_key, self.start_mark, end_mark, gpu)
                if self.span is not None:
                    self.span.end_time = end
                    gpu.submit(self.span, self.start_mark, end_mark)
                return
            seconds = (end - self.start) / 1e9
            record_metric(avg_key, seconds, _MEAN)
            record_metric(max_key, seconds, _MAX)
            if self.span is not None:
                close_span(self.span, end)
        except Exception as exc:
            report_internal_error("collective completion", exc)
