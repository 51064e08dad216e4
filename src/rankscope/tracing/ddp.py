"""DistributedDataParallel's gradient all-reduces, seen: each bucket a collective.

DDP's reducer all-reduces each gradient bucket with its built-in C++ hook, which the collectives'
wrappers (``tracing.collectives``) never see: the ranks that waited for a late one would hold
that wait inside their backward, and look slow there. So each DDP module gets, when it is made,
DDP's own ``allreduce_hook`` (the built-in hook's Python form: divide by the group's size,
all-reduce): its ``dist.all_reduce(async_op=True)`` goes through the wrappers, so each bucket is
a ``comm/all_reduce`` span from its launch to its completion (``rankscope.comm.source`` "ddp"),
matched across ranks like any collective (``sink.book.stragglers``).

A module made before rankscope started (a script whose first rankscope call comes after
``DDP(...)``, as the tutorial's may) gets its route at its first forward since: a hook registered
between two iterations runs from the next backward.

A reducer takes one hook, once. So what is registered is a route to the hook that runs; a hook
registered later (the user's, ``register_comm_hook``; a built-in one, as its Python form)
replaces the route's, through ``dist._register_comm_hook`` swapped; a second one is refused as
torch refuses it. A hook DDP registers while it is made (``mixed_precision``) is left as it is.
The default hook reads the module's process group when it runs (``_update_process_group``).

Not the same as DDP's C++ hook: ``join(divide_by_initial_world_size=False)`` is not honoured (a
communication hook always divides by the group's size, as torch documents for hooks). Not
routed: DDP's Python reducer under compiled autograd (functional collectives): judged from the
phases alone. (A module rebuilt by unpickling or ``deepcopy``, made without ``__init__``, is routed
at its first forward, as one made before rankscope started.) Installed and
removed with the collectives' wrappers (``RANKSCOPE_COLLECTIVES``): off, DDP keeps its C++ hook.
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
from . import collectives

_DDP_MODULE = "torch.nn.parallel.distributed"
_saved: dict[tuple[Any, str], Any] = {}
_lock = threading.Lock()
_routes: dict[int, _Route] = {}
"""``id`` of a DDP module's reducer -> its route."""
_seen: weakref.WeakSet[Any] = weakref.WeakSet()
"""DDP modules routed (or left with the hook they had) since ``install``: the others are routed at
their next forward."""


class _Route:
    """The hook a DDP module's reducer runs: DDP's ``allreduce_hook`` on the module's process group
    (read when it runs), until a hook is registered (``state``: its own)."""

    __slots__ = ("hook", "module", "registered", "state")

    def __init__(self, module: Any, hook: Any) -> None:
        self.module = weakref.ref(module)
        self.hook = hook
        self.state: Any = None
        self.registered = False
        """Whether a hook was registered on it (a second is refused, as torch refuses it)."""

    def run(self, bucket: Any) -> Any:
        if self.registered:
            return self.hook(self.state, bucket)
        return self.hook(getattr(self.module(), "process_group", None), bucket)


def _run(route: _Route, bucket: Any) -> Any:
    """The reducer's hook (DDP calls it once per bucket): the route's; the collectives it calls
    are DDP's (the sink reads a bucket's wait as starting after the rank's last bucket launch)."""
    with collectives.called_by("ddp"):
        return route.run(bucket)


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
            if route is None or route.registered:  # not routed; or a second hook: torch refuses it
                register(reducer, state, hook)
                return
            route.hook, route.state, route.registered = hook, state, True

        def _register_builtin_comm_hook(reducer: Any, kind: Any) -> None:
            route = _route_of(reducer)
            if route is None or route.registered:
                register_builtin(reducer, kind)
                return
            python = _builtin(dist).get(kind)
            if python is None:
                raise RuntimeError(
                    f"rankscope routes this DDP module's buckets to see them and has no Python form of {kind}; "
                    "set RANKSCOPE_COLLECTIVES=0 to register it"
                )
            route.hook, route.state, route.registered = python, getattr(route.module(), "process_group", None), True

        swap(dist, "_register_comm_hook", _register_comm_hook, _saved)
        swap(dist, "_register_builtin_comm_hook", _register_builtin_comm_hook, _saved)
    loaded = sys.modules.get(_DDP_MODULE)
    if loaded is not None:
        _patch(loaded, register)
    else:
        wrapt.register_post_import_hook(lambda module: _patch(module, register), _DDP_MODULE)
    return True


def uninstall() -> None:
    """Put back what ``install`` replaced; modules already made keep their route (their hooks run)."""
    with _lock:
        restore(_saved)


def _patch(module: ModuleType, register: Any) -> None:
    """DDP's ``__init__`` then registers the route (still installed: not undone meanwhile)."""
    with _lock:
        ddp_class = getattr(module, "DistributedDataParallel", None)
        if not _saved or ddp_class is None or (ddp_class, "__init__") in _saved:
            return
        made = ddp_class.__init__

        forward = ddp_class.forward

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            made(self, *args, **kwargs)
            _routed(self, register)

        def routed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self not in _seen:  # made before rankscope started (its first call came after ``DDP(...)``)
                _routed(self, register)
            return forward(self, *args, **kwargs)

        init.__name__, init.__qualname__, init.__doc__ = "__init__", made.__qualname__, made.__doc__
        init.__wrapped__ = made  # type: ignore[attr-defined]
        routed_forward.__name__, routed_forward.__qualname__ = "forward", forward.__qualname__
        routed_forward.__doc__, routed_forward.__wrapped__ = forward.__doc__, forward  # type: ignore[attr-defined]
        swap(ddp_class, "__init__", init, _saved)
        swap(ddp_class, "forward", routed_forward, _saved)


def _routed(module: Any, register: Any) -> None:
    """Route ``module``'s reducer once: when it is made, or, made before rankscope started, at its
    first forward since (a hook registered between two iterations runs from the next backward)."""
    _seen.add(module)
    try:
        _route(module, register)
    except Exception as exc:  # DDP keeps its built-in hook: judged from its phases
        report_internal_error("DDP communication hook", exc)


def _builtin(dist: Any) -> dict[Any, Any]:
    """DDP's built-in hooks by kind, as their Python forms."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {
        dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
        dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
    }


def _route(module: Any, register: Any) -> None:
    """Register ``module``'s route, unless DDP registered a hook while it was made."""
    reducer = getattr(module, "reducer", None)
    if reducer is None or getattr(module, "_comm_hooks", None) or _route_of(reducer) is not None or _hooked(module):
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    route = _Route(module, default_hooks.allreduce_hook)
    register(reducer, route, _run)
    key = id(reducer)
    _routes[key] = route
    weakref.finalize(module, _forget, key, route)


def _hooked(module: Any) -> bool:
    """Whether ``module``'s reducer has a hook already: a built-in one registered before rankscope
    started (its logging data names it; ``_comm_hooks`` lists only Python hooks)."""
    try:
        return bool(module._get_ddp_logging_data().get("comm_hook"))
    except Exception:  # another torch: as before, the route is tried
        return False


def _forget(key: int, route: _Route) -> None:
    """The module was collected: forget its route (not a newer one under a reused id)."""
    if _routes.get(key) is route:
        _routes.pop(key, None)


def _route_of(reducer: Any) -> _Route | None:
    route = _routes.get(id(reducer))
    if route is None:
        return None
    module = route.module()
    return route if module is not None and getattr(module, "reducer", None) is reducer else None
