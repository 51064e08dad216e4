"""Controller-driven steps for Monarch actors.

When a Monarch controller calls ``flush(N)``, every live process mesh it created gets a
``flush(N)`` message through a small actor spawned once per mesh. Monarch delivers it
after the replies the controller already awaited, so everything the actors recorded during
those calls is stamped with step N in the actor processes themselves — exactly, however
late their exports reach the sink. The controller's own flush marker carries how many
processes it flushed, so the sink waits for all of them.

The process meshes come from a torchmonarch internal (``_compat.live_proc_meshes``); if it
moves, fan-out is skipped with one warning and actor values fall back to the step in
progress at the sink.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from monarch.actor import Actor, current_size, endpoint

from ...core import runtime as _slot
from . import _compat

_flushers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def in_actor() -> bool:
    try:
        return bool(dict(current_size()))
    except Exception:
        return False


class StepFlusher(Actor):  # type: ignore[misc]  # monarch ships no type information: Actor is Any
    """Lives on each actor process mesh; closes the controller's step there."""

    @endpoint  # type: ignore[untyped-decorator]  # likewise untyped; it makes flush an Endpoint
    async def flush(self, step: int, controller_pid: int) -> None:
        if os.getpid() != controller_pid:  # meshes of the controller's own process
            runtime = _slot.get()
            if runtime is not None:
                runtime.flush_driven(step)


def flush_actors(step: int) -> int:
    """Send ``flush(step)`` to every live process mesh; returns how many processes were asked."""
    meshes = _compat.live_proc_meshes()
    if meshes is None:
        return 0
    asked = 0
    for mesh in meshes:
        extent = mesh.extent
        if not extent.labels:  # the controller's own process
            continue
        flusher = _flushers.get(mesh)
        if flusher is None:
            flusher = _flushers[mesh] = mesh.spawn("rankscope_step_flusher", StepFlusher)
        flusher.flush.broadcast(step, os.getpid())
        asked += extent.nelements
    return asked
