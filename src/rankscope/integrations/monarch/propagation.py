"""Trace context and step across Monarch endpoint calls.

Caller side: every endpoint message gets one extra keyword argument, a small ``Carried``
object (trace id, parent span id, sampled, step, caller label, the caller's latest policy
version, whether to make server spans), added after Monarch has
checked the arguments against the endpoint's signature. Callee side: unpickling
``Carried`` imports this module in the actor process, which wraps the actor's method
lookup once; the wrapper removes the argument and runs the endpoint with the caller's
span as the current (remote) OTel parent and the caller's step as the step in progress.
So the callee's spans are children of the caller's, in the caller's step trace, even when
the actor process never imported rankscope itself (it must be installed there).

With the Monarch instrumentor on in the caller (``rankscope.instrumentation.monarch``),
the callee also wraps each call in a server span ``Class.endpoint`` (tagged with actor
class, endpoint and mesh coordinates) and records per-endpoint calls, latency and failures.

Whether calls made while an endpoint runs ask their callees for server spans follows what
that endpoint's own caller asked (``asks_server_spans``); it is per call, in a ``ContextVar``,
so concurrent endpoints of one actor (``@concurrent_endpoint``, tasks they start) each keep
their own.

The torchmonarch internals this needs, and the record of every patch (reverted by
``uninstall``, which ``MonarchInstrumentor().uninstrument()`` calls), are in ``_compat``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any

from ...core import runtime as _slot
from ...core.policy_version import latest_policy_version, observe_policy_version
from ...tracing.tracer import SpanScope, enter_scope, leave_scope, tracing_of
from . import _compat
from .endpoint_spans import ServerCall, start_server_span

KWARG = "_rankscope_context"
_caller_installed = False
_callee_installed = False


server_spans: bool | None = None
"""Set by the Monarch instrumentor: calls this process makes ask the callee for server spans.
None (no instrumentor here): follow what this process's own callers asked for."""
_inherited: contextvars.ContextVar[bool] = contextvars.ContextVar("rankscope_monarch_server_spans", default=False)
"""What the caller of the endpoint running in this context asked for (``Carried.server``)."""
_OWN_ACTORS = frozenset({"StepFlusher"})
"""rankscope's own actors: no server spans or endpoint metrics (they would open a step of their own)."""


class Carried:
    """What travels with one endpoint call; unpickles through ``_arrive`` in the callee."""

    __slots__ = ("caller", "policy_version", "sampled", "server", "span_id", "step", "trace_id")

    def __init__(
        self,
        trace_id: int,
        span_id: int,
        sampled: bool,
        step: int,
        caller: str,
        policy_version: int | None = None,
        server: bool = False,
    ) -> None:
        self.trace_id, self.span_id, self.sampled, self.step, self.caller = trace_id, span_id, sampled, step, caller
        self.policy_version, self.server = policy_version, server

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        fields = (self.trace_id, self.span_id, self.sampled, self.step, self.caller, self.policy_version, self.server)
        return _arrive, fields


def _arrive(*fields: Any) -> Carried:
    install_callee()
    return Carried(*fields)


def asks_server_spans() -> bool:
    """Whether a call made here now asks its callee for server spans and endpoint metrics."""
    return _inherited.get() if server_spans is None else server_spans


def _carry() -> Carried | None:
    server = asks_server_spans()
    runtime = _slot.current
    if runtime is None:
        if not server:  # the instrumentor configures a bare process
            return None
        runtime = _slot.get()
        if runtime is None:
            return None
    state = tracing_of(runtime)
    scope = state.scope()
    return Carried(
        scope.trace_id, scope.parent_id, scope.sampled, scope.step, state.label, latest_policy_version(), server
    )


def install_caller() -> None:
    """Add the carried context to every endpoint message this process sends (idempotent)."""
    global _caller_installed
    if _caller_installed:
        return
    _caller_installed = True
    hooks = _compat.message_hooks()
    if hooks is None:
        return
    check, create, init_kind = hooks.check, hooks.create, hooks.init_kind

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

    _compat.patch(hooks.module, "_check_endpoint_arguments", check_without_ours)
    _compat.patch(hooks.module, "_create_endpoint_message", create_with_context)


def install_callee() -> None:
    """Wrap the actor method lookup of this process so endpoints run in the carried context."""
    global _callee_installed
    if _callee_installed:
        return
    _callee_installed = True
    install_caller()  # an actor that calls other actors passes the context on
    handler = _compat.actor_handler()
    if handler is None:
        return
    lookup = handler._lookup

    @functools.wraps(lookup)
    def lookup_in_context(self: Any, ctx: Any, method_name: str) -> tuple[Any, bool, bool]:
        method, instrument, is_coro = lookup(self, ctx, method_name)
        return _wrap(method, is_coro, type(self.instance).__name__, method_name), instrument, is_coro

    _compat.patch(handler, "_lookup", lookup_in_context)


def uninstall() -> None:
    """Put back every Monarch function this process patched (caller and callee side)."""
    global _caller_installed, _callee_installed
    _compat.revert()
    _caller_installed = _callee_installed = False


def _enter(kwargs: dict[str, Any], actor: str, endpoint: str) -> tuple[Any, Any]:
    """Enter the carried context; returns what ``_leave`` undoes (the scope, the server-spans token)."""
    carried = kwargs.pop(KWARG, None)
    if not isinstance(carried, Carried):
        return None, None
    runtime = _slot.get()
    if runtime is not None:
        runtime.catch_up(carried.step)
    if carried.policy_version is not None:
        observe_policy_version(carried.policy_version)
    asked = _inherited.set(carried.server)
    if carried.server and actor not in _OWN_ACTORS:
        return start_server_span(carried, actor, endpoint), asked
    scope = SpanScope(carried.trace_id, carried.span_id, carried.sampled, carried.step, carried.caller)
    return enter_scope(scope, remote=True), asked


def _leave(entered: tuple[Any, Any], error: BaseException | None) -> None:
    scope, asked = entered
    if isinstance(scope, ServerCall):
        scope.end(error)
    else:
        leave_scope(scope)
    if asked is not None:
        with contextlib.suppress(ValueError, RuntimeError):  # left in another context: nothing to undo here
            _inherited.reset(asked)


def _wrap(method: Any, is_coro: bool, actor: str, endpoint: str) -> Any:
    if is_coro:

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            entered = _enter(kwargs, actor, endpoint)
            try:
                result = await method(*args, **kwargs)
            except BaseException as exc:
                _leave(entered, exc)
                raise
            _leave(entered, None)
            return result

        return run_async

    def run(*args: Any, **kwargs: Any) -> Any:
        entered = _enter(kwargs, actor, endpoint)
        try:
            result = method(*args, **kwargs)
        except BaseException as exc:
            _leave(entered, exc)
            raise
        _leave(entered, None)
        return result

    return run
