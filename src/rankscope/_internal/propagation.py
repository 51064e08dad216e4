"""Trace context and step across Monarch endpoint calls.

Caller side: every endpoint message gets one extra keyword argument, a small ``Carried``
object (trace id, parent span id, sampled, step, caller label), added after Monarch has
checked the arguments against the endpoint's signature. Callee side: unpickling
``Carried`` imports this module in the actor process, which wraps the actor's method
lookup once; the wrapper removes the argument and runs the endpoint with the caller's
span as the current (remote) OTel parent and the caller's step as the step in progress.
So the callee's spans are children of the caller's, in the caller's step trace, even when
the actor process never imported rankscope itself (it must be installed there).

Uses torchmonarch 0.7 internals (``actor_mesh._create_endpoint_message``,
``_check_endpoint_arguments``, ``_Actor._lookup``); if they move, nothing is patched and
calls go out unchanged, with one warning.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

KWARG = "_rankscope_context"
_caller_installed = False
_callee_installed = False


class Carried:
    """What travels with one endpoint call; unpickles through ``_arrive`` in the callee."""

    __slots__ = ("caller", "sampled", "span_id", "step", "trace_id")

    def __init__(self, trace_id: int, span_id: int, sampled: bool, step: int, caller: str) -> None:
        self.trace_id, self.span_id, self.sampled, self.step, self.caller = trace_id, span_id, sampled, step, caller

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _arrive, (self.trace_id, self.span_id, self.sampled, self.step, self.caller)


def _arrive(trace_id: int, span_id: int, sampled: bool, step: int, caller: str) -> Carried:
    install_callee()
    return Carried(trace_id, span_id, sampled, step, caller)


def _carry() -> Carried | None:
    from . import main

    runtime = main._runtime
    if runtime is None:
        return None
    state = runtime.tracing
    scope = state.scope()
    return Carried(scope.trace_id, scope.parent_id, scope.sampled, scope.step, state.label)


def install_caller() -> None:
    """Add the carried context to every endpoint message this process sends (idempotent)."""
    global _caller_installed
    if _caller_installed:
        return
    _caller_installed = True
    try:
        from monarch._src.actor import actor_mesh

        check, create = actor_mesh._check_endpoint_arguments, actor_mesh._create_endpoint_message
        init_kind = actor_mesh.MethodSpecifier.Init
    except (ImportError, AttributeError) as exc:
        warnings.warn(
            f"rankscope: cannot propagate trace context over Monarch calls ({exc!r})", RuntimeWarning, stacklevel=3
        )
        return

    @functools.wraps(check)
    def check_without_ours(method: Any, signature: Any, args: Any, kwargs: Any) -> Any:
        if KWARG in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != KWARG}
        return check(method, signature, args, kwargs)

    @functools.wraps(create)
    def create_with_context(method: Any, signature: Any, args: Any, kwargs: Any, *rest: Any, **kw: Any) -> Any:
        if not isinstance(method, init_kind):
            try:
                carried = _carry()
            except Exception:
                carried = None
            if carried is not None:
                kwargs = {**kwargs, KWARG: carried}
        return create(method, signature, args, kwargs, *rest, **kw)

    actor_mesh._check_endpoint_arguments = check_without_ours
    actor_mesh._create_endpoint_message = create_with_context


def install_callee() -> None:
    """Wrap the actor method lookup of this process so endpoints run in the carried context."""
    global _callee_installed
    if _callee_installed:
        return
    _callee_installed = True
    from monarch._src.actor.actor_mesh import _Actor

    lookup = _Actor._lookup

    def lookup_in_context(self: Any, ctx: Any, method_name: str) -> tuple[Any, bool, bool]:
        method, instrument, is_coro = lookup(self, ctx, method_name)
        return _wrap(method, is_coro), instrument, is_coro

    _Actor._lookup = lookup_in_context  # type: ignore[method-assign]


def _enter(kwargs: dict[str, Any]) -> Any:
    carried = kwargs.pop(KWARG, None)
    if not isinstance(carried, Carried):
        return None
    from .tracing import Scope, enter_scope

    scope = Scope(carried.trace_id, carried.span_id, carried.sampled, carried.step, carried.caller)
    return enter_scope(scope, remote=True)


def _leave(tokens: Any) -> None:
    from .tracing import leave_scope

    leave_scope(tokens)


def _wrap(method: Any, is_coro: bool) -> Any:
    if is_coro:

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            tokens = _enter(kwargs)
            try:
                return await method(*args, **kwargs)
            finally:
                _leave(tokens)

        return run_async

    def run(*args: Any, **kwargs: Any) -> Any:
        tokens = _enter(kwargs)
        try:
            return method(*args, **kwargs)
        finally:
            _leave(tokens)

    return run
