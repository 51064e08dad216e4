"""DistributedDataParallel's gradient all-reduces, seen: each bucket a collective.

DDP's reducer all-reduces each gradient bucket with its built-in C++ hook, which the collectives'
wrappers (``tracing.collectives``) never see: the ranks that waited for a late one would hold
that wait inside their backward, and look slow there. So each DDP module gets, when it is made,
DDP's own ``allreduce_hook`` (the built-in hook's Python form, documented to give the same
result: divide by the group's size, all-reduce): its ``dist.all_reduce(async_op=True)`` goes
through the wrappers, so each bucket is a ``comm/all_reduce`` span from its launch to its
completion, matched across ranks like any collective (``sink.book.stragglers``).

A reducer takes one hook, once. So what is registered is a route to the hook that runs; a hook
registered later (the user's, ``register_comm_hook``; a built-in one, as its Python form)
replaces the route's, through ``dist._register_comm_hook`` swapped. A hook DDP registers while it
is made (``mixed_precision``) is left as it is. Installed and removed with the collectives'
wrappers (``RANKSCOPE_COLLECTIVES``): off, DDP keeps its C++ hook, and the sink judges its
waits from the phases alone.
"""

from __future__ import annotations

import sys
import threading
import weakref
from types import ModuleType
from typing import Any

import wrapt

from ..core.errors import report_internal_error
from ..core.patching import restore, swap

_saved: dict[tuple[Any, str], Any] = {}
_lock = threading.Lock()
_DDP_MODULE = "torch.nn.parallel.distributed"
_routes: dict[int, tuple[weakref.ref[Any], _Route]] = {}
"""``id`` of a DDP module's reducer -> (the module, its route)."""


class _Route:
    """The hook a reducer runs: DDP's ``allreduce_hook`` on its process group until another is registered."""

    __slots__ = ("hook", "state")

    def __init__(self, hook: Any, state: Any) -> None:
        self.hook, self.state = hook, state


def _run(route: _Route, bucket: Any) -> Any:
    """The reducer's hook: the route's, with its state (DDP calls it once per bucket)."""
    return route.hook(route.state, bucket)


def install(dist: ModuleType) -> bool:
    """Give every DDP module made from now on the routed hook; False if already installed or
    this torch has no distributed support. Called while torch itself may still be importing
    (``opentelemetry-instrument`` wraps ``torch.distributed`` as it loads): DDP's class is patched
    once ``torch.nn.parallel.distributed`` is loaded, its hooks imported when a module is made."""
    with _lock:
        if _saved or not dist.is_available():
            return False
        register, register_builtin = dist._register_comm_hook, dist._register_builtin_comm_hook

        def _register_comm_hook(reducer: Any, state: Any, hook: Any) -> None:
            route = _route_of(reducer)
            if route is None:
                register(reducer, state, hook)
            else:
                route.hook, route.state = hook, state

        def _register_builtin_comm_hook(reducer: Any, kind: Any) -> None:
            route = _route_of(reducer)
            python = _builtin(dist).get(kind) if route is not None else None
            if route is None or python is None:
                register_builtin(reducer, kind)
                return
            found = _routes.get(id(reducer))
            module = found[0]() if found is not None else None
            route.hook, route.state = python, getattr(module, "process_group", None)

        swap(dist, "_register_comm_hook", _register_comm_hook, _saved)
        swap(dist, "_register_builtin_comm_hook", _register_builtin_comm_hook, _saved)
    loaded = sys.modules.get(_DDP_MODULE)
    if loaded is not None:
        _patch(loaded, register)
    else:
        wrapt.register_post_import_hook(lambda module: _patch(module, register), _DDP_MODULE)
    return True


def _patch(module: ModuleType, register: Any) -> None:
    """DDP's ``__init__`` then registers the route (still installed: not undone meanwhile)."""
    with _lock:
        ddp_class = getattr(module, "DistributedDataParallel", None)
        if not _saved or ddp_class is None or (ddp_class, "__init__") in _saved:
            return
        made = ddp_class.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            made(self, *args, **kwargs)
            try:
                _route(self, register)
            except Exception as exc:  # DDP keeps its built-in hook: judged from its phases
                report_internal_error("DDP communication hook", exc)

        init.__name__, init.__qualname__, init.__doc__ = "__init__", made.__qualname__, made.__doc__
        init.__wrapped__ = made  # type: ignore[attr-defined]
        swap(ddp_class, "__init__", init, _saved)


def _builtin(dist: Any) -> dict[Any, Any]:
    """DDP's built-in hooks by kind, as their Python forms."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {
        dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
        dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
    }


def uninstall() -> None:
    """Put back what ``install`` replaced; modules already made keep their route (their hooks run)."""
    with _lock:
        restore(_saved)


def _route(module: Any, register: Any) -> None:
    """Register ``module``'s route (DDP's ``allreduce_hook`` on its group), unless DDP registered a
    hook while it was made or has no reducer (its Python reducer under compiled autograd)."""
    reducer = getattr(module, "reducer", None)
    if reducer is None or getattr(module, "_comm_hooks", None) or _route_of(reducer) is not None:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    route = _Route(default_hooks.allreduce_hook, getattr(module, "process_group", None))
    register(reducer, route, _run)
    key = id(reducer)

    def gone(ref: weakref.ref[Any]) -> None:  # the module was collected: forget its route (not a newer one's)
        if _routes.get(key, (None,))[0] is ref:
            del _routes[key]

    _routes[key] = (weakref.ref(module, gone), route)


def _route_of(reducer: Any) -> _Route | None:
    found = _routes.get(id(reducer))
    if found is None:
        return None
    module = found[0]()
    return found[1] if module is not None and getattr(module, "reducer", None) is reducer else None
