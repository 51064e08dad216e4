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

Uses torchmonarch 0.7 internals (``actor_mesh._create_endpoint_message``,
``_check_endpoint_arguments``, ``_Actor._lookup``); if they move, nothing is patched and
calls go out unchanged, with one warning.
"""

from __future__ import annotations

import functools
from typing import Any

from ...core import runtime as _slot
from ...core.errors import warn
from ...core.policy_version import latest_policy_version, observe_policy_version
from ...tracing.tracer import Scope, enter_scope, leave_scope
from .endpoint_spans import ServerCall, start_server_span

KWARG = "_rankscope_context"
_caller_installed = False
_callee_installed = False


server_spans: bool | None = None
"""Set by the Monarch instrumentor: calls this process makes ask the callee for server spans.
None (no instrumentor here): follow what this process's own callers asked for."""
_inherited = False
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


def _carry() -> Carried | None:
    server = _inherited if server_spans is None else server_spans
    runtime = _slot.current
    if runtime is None:
        if not server:  # the instrumentor configures a bare process
            return None
        runtime = _slot.get()
        if runtime is None:
            return None
    state = runtime.tracing
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
    try:
        from monarch._src.actor import actor_mesh

        check, create = actor_mesh._check_endpoint_arguments, actor_mesh._create_endpoint_message
        init_kind = actor_mesh.MethodSpecifier.Init
    except (ImportError, AttributeError) as exc:
        warn(f"rankscope: cannot propagate trace context over Monarch calls ({exc!r})")
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
    install_caller()  # an actor that calls other actors passes the context on
    from monarch._src.actor.actor_mesh import _Actor

    lookup = _Actor._lookup

    def lookup_in_context(self: Any, ctx: Any, method_name: str) -> tuple[Any, bool, bool]:
        method, instrument, is_coro = lookup(self, ctx, method_name)
        return _wrap(method, is_coro, type(self.instance).__name__, method_name), instrument, is_coro

    _Actor._lookup = lookup_in_context  # type: ignore[method-assign]


def _enter(kwargs: dict[str, Any], actor: str, endpoint: str) -> Any:
    carried = kwargs.pop(KWARG, None)
    if not isinstance(carried, Carried):
        return None
    global _inherited
    runtime = _slot.get()
    if runtime is not None:
        runtime.catch_up(carried.step)
    if carried.policy_version is not None:
        observe_policy_version(carried.policy_version)
    _inherited = carried.server
    if carried.server and actor not in _OWN_ACTORS:
        return start_server_span(carried, actor, endpoint)
    scope = Scope(carried.trace_id, carried.span_id, carried.sampled, carried.step, carried.caller)
    return enter_scope(scope, remote=True)


def _leave(entered: Any, error: BaseException | None) -> None:
    if isinstance(entered, ServerCall):
        entered.end(error)
    else:
        leave_scope(entered)


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
