"""Optimizer steps: a span per ``optimizer.step()``, its duration, the learning rate of every
param group, optionally the gradient norm; and (``auto_step``) each step of the first
optimizer closes a rankscope step, so a script that never calls ``flush`` still gets
per-step views. Uses torch's global optimizer step hooks, so every optimizer is covered.

``optimizer.step(closure)`` (LBFGS; every step under PyTorch Lightning, which runs forward,
backward and the gradient all-reduce inside the closure): the closure's time is
``optimizer/closure_s`` and ``optimizer/step_s`` is the optimizer's own part, not both."""

from __future__ import annotations

import time
import weakref
from types import ModuleType
from typing import Any

from ..core import names as attr
from ..core.errors import report_internal_error
from ..core.settings import resolve
from ..lifecycle import auto_step
from ..metrics.recording import record_metric
from ..metrics.reduce import Reduce
from ..tracing.tracer import close_span, open_span
from ._base import ModuleInstrumentor

_SUM, _MEAN, _MAX = Reduce.SUM, Reduce.MEAN, Reduce.MAX
_lr_keys = [f"optimizer/lr/group_{i}" for i in range(64)]


class OptimizerInstrumentor(ModuleInstrumentor):
    """``instrument(grad_norm=False, auto_step=None)``; both default to their settings
    (``RANKSCOPE_GRAD_NORM``, ``RANKSCOPE_AUTO_STEP``)."""

    target = "torch.optim.optimizer"

    def _apply(self, module: ModuleType) -> None:
        grad_norm = bool(self.options.get("grad_norm", resolve("grad_norm")))
        auto_step = self.options.get("auto_step")
        self._state = _Hooks(grad_norm, resolve("auto_step") if auto_step is None else bool(auto_step))
        self._handles = [
            module.register_optimizer_step_pre_hook(self._state.pre),
            module.register_optimizer_step_post_hook(self._state.post),
        ]

    def _revert(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class _Hooks:
    def __init__(self, grad_norm: bool, auto_step: bool) -> None:
        self.grad_norm = grad_norm
        self.auto_step = auto_step
        self.started: dict[int, tuple[float, Any]] = {}
        self.closures: dict[int, _TimedClosure] = {}
        self.primary: weakref.ref[Any] | None = None

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        try:
            span = open_span("optimizer/step", {attr.OPTIMIZER: type(optimizer).__name__})
            self.started[id(optimizer)] = (time.perf_counter(), span)
            if self.grad_norm:
                _record_grad_norm(optimizer)
            # torch passes the call's own arguments: (optimizer, closure?), {closure?}
            closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 else None)
            if callable(closure):  # timed apart: it is the model's forward and backward, not the optimizer
                timed = self.closures[id(optimizer)] = _TimedClosure(closure)
                if "closure" in kwargs:
                    return args, {**kwargs, "closure": timed}
                return (args[0], timed, *args[2:]), kwargs
        except Exception as exc:
            report_internal_error("optimizer pre-step hook", exc)
        return None

    def post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            started = self.started.pop(id(optimizer), None)
            closure = self.closures.pop(id(optimizer), None)
            if started is not None:
                seconds = time.perf_counter() - started[0]
                if closure is not None:
                    record_metric("optimizer/closure_s", closure.seconds, _MEAN)
                    seconds = max(0.0, seconds - closure.seconds)
                record_metric("optimizer/step_s", seconds, _MEAN)
                record_metric("optimizer/step_max_s", seconds, _MAX)
                if started[1] is not None:
                    close_span(started[1])
            record_metric("optimizer/steps", 1, _SUM)
            for index, group in enumerate(optimizer.param_groups):
                lr = group.get("lr")
                if lr is not None:
                    key = _lr_keys[index] if index < len(_lr_keys) else f"optimizer/lr/group_{index}"
                    record_metric(key, lr, _MEAN)
            if self.auto_step:
                primary = self.primary() if self.primary is not None else None
                if primary is None:
                    self.primary, primary = weakref.ref(optimizer), optimizer
                if primary is optimizer:
                    auto_step()
        except Exception as exc:
            report_internal_error("optimizer post-step hook", exc)


class _TimedClosure:
    """The closure passed to ``optimizer.step``, timed (LBFGS calls it several times: summed)."""

    __slots__ = ("closure", "seconds")

    def __init__(self, closure: Any) -> None:
        self.closure = closure
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.closure(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started


def _record_grad_norm(optimizer: Any) -> None:
    """L2 norm of this rank's gradients (local shards for DTensor), without a host sync."""
    import torch

    grads = [
        p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        for group in optimizer.param_groups
        for p in group["params"]
        if p.grad is not None
    ]
    if grads:
        norms = torch._foreach_norm(grads)
        record_metric("optimizer/grad_norm", torch.linalg.vector_norm(torch.stack(norms)), _MAX)
