"""The runtime slot: the one place that holds this process's rankscope runtime.

``rankscope.lifecycle`` assembles a ``Runtime`` (recorder, step clock, tracing, export thread)
and installs it here. Every layer below the assembler (metrics, steps, tracing, integrations)
reads the runtime from this slot and never imports the assembler, so imports only go down.
The assembler also registers how to start rankscope from the environment (``set_starter``):
the first call of anything auto-initializes through ``get``.

``recorder`` is the installed runtime's recorder, kept beside it; ``record_metric`` follows it in a
module global of its own (``watch``), so its fast path costs one global read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..lifecycle import Runtime
    from ..metrics.recorder import Recorder

current: Runtime | None = None
recorder: Recorder | None = None
disabled = False
"""``RANKSCOPE_DISABLE`` or ``init(disable=True)``: every call is a no-op, nothing starts."""

_starter: Callable[[], Runtime | None] | None = None


_watchers: list[Callable[[Recorder | None, bool], None]] = []


def install(runtime: Runtime | None, *, off: bool = False) -> None:
    """Make ``runtime`` the process's runtime (None: none yet, or ``off``: disabled)."""
    global current, recorder, disabled
    current, recorder, disabled = runtime, None if runtime is None else runtime.recorder, off
    for watcher in _watchers:
        watcher(recorder, off)


def watch(watcher: Callable[[Recorder | None, bool], None]) -> None:
    """Call ``watcher(recorder, disabled)`` now and at every ``install``: the hot path keeps its
    own module-global copy (one dict lookup cheaper than an attribute of this module)."""
    _watchers.append(watcher)
    watcher(recorder, disabled)


def set_starter(start: Callable[[], Runtime | None]) -> None:
    """How ``get`` starts rankscope at first use (set once by ``rankscope.lifecycle``)."""
    global _starter
    _starter = start


def get() -> Runtime | None:
    """The runtime, started from the environment on first use; None when disabled."""
    runtime = current
    if runtime is None and not disabled and _starter is not None:
        runtime = _starter()
    return runtime
