"""The runtime slot: the one place that holds this process's rankscope runtime.

``rankscope.lifecycle`` assembles a runtime (recorder, step clock, tracing, export thread) and
installs it here. Every stage below the assembler (metrics, steps, tracing, integrations) reads
the runtime from this slot and never imports the assembler, so imports only go down; not even
the type checker imports upwards: what those stages use of the runtime is the ``Runtime``
protocol below, which ``lifecycle``'s runtime satisfies. The assembler also registers how to
start rankscope from the environment (``set_starter``): the first call of anything
auto-initializes through ``get``.

``recorder`` is the installed runtime's recorder, kept beside it; ``record_metric`` follows it in a
module global of its own (``watch``), so its fast path costs one global read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Steps(Protocol):
    """What the stages below ``lifecycle`` read and set of the runtime's step clock."""

    auto_pending: bool
    """An instrumented optimizer step ended; the step closes at the next instrumented event."""
    explicit: int | None
    """``set_step``'s step in progress, until the next flush."""


class Runtime(Protocol):
    """What the stages below ``lifecycle`` use of the process's runtime (``lifecycle.Runtime`` is one).

    ``recorder`` is the metrics stage's ``Recorder`` and ``tracing`` the tracing stage's
    ``TracingState``. This leaf cannot name either (both stages sit above it), so both read as
    ``Any`` here; the stage that owns each annotates it where it takes it
    (``metrics.recording._recorder``, ``tracing.tracer._state``).
    """

    @property
    def recorder(self) -> Any: ...

    @property
    def tracing(self) -> Any: ...

    @property
    def steps(self) -> Steps: ...

    def settle_auto_step(self) -> None:
        """Close the step an instrumented optimizer step left pending."""

    def flush_driven(self, step: int) -> None:
        """Close ``step`` here, asked by the process that drives this one."""

    def catch_up(self, step: int) -> None:
        """An endpoint call of the driver's step ``step`` arrived: close the step before it first."""


current: Runtime | None = None
recorder: Any = None
"""``current.recorder`` (None with no runtime): the metrics stage's ``Recorder``."""
disabled = False
"""``RANKSCOPE_DISABLE`` or ``init(disable=True)``: every call is a no-op, nothing starts."""
ended = False
"""The program called ``shutdown``: until it calls ``init`` again, the collectives instrumentor
records nothing, so a ``dist.barrier()`` after it starts no runtime of its own (a user's own call
still does)."""

_starter: Callable[[], Runtime | None] | None = None


_watchers: list[Callable[[Any, bool], None]] = []


def install(runtime: Runtime | None, *, off: bool = False) -> None:
    """Make ``runtime`` the process's runtime (None: none yet, or ``off``: disabled)."""
    global current, recorder, disabled
    current, recorder, disabled = runtime, None if runtime is None else runtime.recorder, off
    for watcher in _watchers:
        watcher(recorder, off)


def watch(watcher: Callable[[Any, bool], None]) -> None:
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
