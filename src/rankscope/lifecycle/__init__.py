"""A process's rankscope from ``init`` to ``shutdown``: assembling its runtime, driving its
steps, taking it down, and its forked children.

One module per job, in layers (each imports only the ones below it; import-linter holds it):

- ``assemble``: ``init`` and auto-init build the ``Runtime`` and install it in the runtime
  slot (``core.runtime``); the first one registers the process's at-fork and at-exit hooks.
- ``stopping``: SIGTERM (a launcher's stop) taken like an exit: shutdown, then SIGTERM's own end.
- ``shutdown``: ``shutdown``, ``force_flush``, ``write_report``, ``dropped_points``, and the
  exit hooks (``atexit``, a multiprocessing child's finalizer).
- ``fork``: the at-fork hooks (a relay socket pair per child) and a forked child's re-arm.
- ``driving``: the ``Runtime`` and what runs between init and shutdown: ``flush``, a driving
  process's fan-out (``drive_processes``, ``flush_driven``), automatic steps, ``capture``.
- ``state``: what the jobs share in a process, in one object (``state.process``): the lifecycle
  lock, whether the hooks are registered, the fan-outs, and what forks leave behind.

This module only re-exports what the rest of rankscope imports from ``rankscope.lifecycle``.
"""

from .assemble import get_resource, init
from .driving import (
    Runtime,
    auto_step,
    capture,
    current_step,
    drive_processes,
    flush,
    flush_driven,
    follow_driver,
    settle_auto_step,
)
from .shutdown import dropped_points, force_flush, shutdown, write_report

__all__ = [
    "Runtime",
    "auto_step",
    "capture",
    "current_step",
    "drive_processes",
    "dropped_points",
    "flush",
    "flush_driven",
    "follow_driver",
    "force_flush",
    "get_resource",
    "init",
    "settle_auto_step",
    "shutdown",
    "write_report",
]
