"""Every private torchmonarch symbol rankscope uses, and every patch it makes to Monarch.

Nothing else in rankscope imports ``monarch._src``; the public ``monarch.actor`` is used
where it is enough. Read from torchmonarch 0.7.0 (``monarch/_src/actor/actor_mesh.py`` and
``proc_mesh.py``):

- ``actor_mesh._check_endpoint_arguments(method, signature, args, kwargs)`` and
  ``actor_mesh._create_endpoint_message(method, signature, args, kwargs, port, proc_mesh, ...)``,
  looked up as module globals when a message is made: wrapped so that every endpoint message
  carries rankscope's context (``propagation``) past the signature check.
- ``actor_mesh.MethodSpecifier.Init``: the constructor message, which carries nothing.
- ``actor_mesh._Actor._lookup(self, ctx, method_name) -> (method, instrument, is_coro)``: wrapped
  in the callee so that each endpoint runs in its caller's context.
- ``proc_mesh._proc_mesh_registry`` (a ``WeakSet`` of the process meshes this process made) and
  ``ProcMesh._stopped``: where a controller's ``flush(N)`` goes (``actors``).
- ``ACTOR_MESH``, the module ``MonarchInstrumentor`` waits for.

If a torchmonarch release moves one of them, the feature that needs it turns off with one
warning (``core.errors.warn``) and the job goes on: without the message hooks calls go out
unchanged (no trace context, step or server spans in actors); without ``_Actor._lookup`` endpoints
run without their caller's context; without the registry a controller's ``flush(N)`` reaches no
actor and actor values fall back to the step in progress at the sink.

Every patch goes through ``patch``, which records the owner, attribute and original;
``revert`` puts all the originals back (``MonarchInstrumentor().uninstrument()``), as the contrib
instrumentors' ``unwrap`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from types import ModuleType
from typing import Any, NamedTuple, cast

from ...core.errors import warn

ACTOR_MESH = "monarch._src.actor.actor_mesh"
READ_FROM = "0.7.0"

_patches: dict[tuple[int, str], tuple[Any, str, Any]] = {}
_warned: set[str] = set()


class MessageHooks(NamedTuple):
    """What the caller side wraps: the module and its two functions, and the Init kind."""

    module: ModuleType
    check: Callable[..., Any]
    create: Callable[..., Any]
    init_kind: type


def _unavailable(feature: str, consequence: str, exc: BaseException) -> None:
    if feature in _warned:
        return
    _warned.add(feature)
    try:
        version = metadata.version("torchmonarch")
    except metadata.PackageNotFoundError:
        version = "unknown"
    warn(
        f"rankscope: torchmonarch {version} has no {feature} (read from {READ_FROM}: {exc!r}); {consequence}",
        stacklevel=3,
    )


def message_hooks() -> MessageHooks | None:
    """The endpoint message functions, or None (one warning) when they moved."""
    try:
        from monarch._src.actor import actor_mesh

        return MessageHooks(
            actor_mesh,
            actor_mesh._check_endpoint_arguments,
            actor_mesh._create_endpoint_message,
            actor_mesh.MethodSpecifier.Init,
        )
    except (ImportError, AttributeError) as exc:
        _unavailable(
            "actor_mesh._create_endpoint_message/_check_endpoint_arguments",
            "trace context and steps do not travel over Monarch calls",
            exc,
        )
        return None


def actor_handler() -> type[Any] | None:
    """``_Actor``, whose ``_lookup`` finds the method an incoming message runs; None when it moved."""
    try:
        from monarch._src.actor.actor_mesh import _Actor

        if not callable(getattr(_Actor, "_lookup", None)):
            raise AttributeError("type object '_Actor' has no attribute '_lookup'")
        return cast("type[Any]", _Actor)  # monarch ships no type information
    except (ImportError, AttributeError) as exc:
        _unavailable("actor_mesh._Actor._lookup", "endpoints run without their caller's trace context", exc)
        return None


def live_proc_meshes() -> list[Any] | None:
    """The process meshes this process made that are not stopped; None (one warning) when unknown."""
    try:
        from monarch._src.actor.proc_mesh import _proc_mesh_registry

        return [mesh for mesh in list(_proc_mesh_registry) if not getattr(mesh, "_stopped", False)]
    except Exception as exc:
        _unavailable("proc_mesh._proc_mesh_registry", "actor steps follow the sink", exc)
        return None


def patch(owner: Any, name: str, replacement: Any) -> None:
    """``setattr(owner, name, replacement)``, remembering the first original for ``revert``."""
    _patches.setdefault((id(owner), name), (owner, name, getattr(owner, name)))
    setattr(owner, name, replacement)


def patched() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, original) of every patch in place."""
    return list(_patches.values())


def revert() -> None:
    """Put every patched Monarch attribute back to its original."""
    while _patches:
        _, (owner, name, original) = _patches.popitem()
        setattr(owner, name, original)
