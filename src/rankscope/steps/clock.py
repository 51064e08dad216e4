"""The one step clock of a process: which step is in progress, and who closes steps.

Steps are closed four ways: explicitly (``flush(N)``), automatically (an instrumented
``optimizer.step()`` in a program that never flushes), by a Monarch controller (its actors'
steps follow its ``flush``) and, for tracing only, ``set_step(N)`` announcing the step in
progress before it is flushed. All four read and write this one object, so ``current_step()``,
the step spans hang under and the step values are stamped with never disagree.
"""

from __future__ import annotations


class StepClock:
    """Step state of one process (owned by the runtime; survives ``init`` being called again)."""

    __slots__ = ("auto", "auto_pending", "closed", "controller", "driven", "explicit", "flushed", "last")

    def __init__(self) -> None:
        self.last: int | None = None
        """The last closed step (None before the first flush)."""
        self.explicit: int | None = None
        """``set_step``'s step in progress, until the next flush."""
        self.flushed = False
        """The program has closed a step (periodic exports stop)."""
        self.auto = True
        """Instrumentors may close steps, until the program flushes by itself (``auto_step``)."""
        self.auto_pending = False
        """An instrumented optimizer step ended; the step closes at the next instrumented event."""
        self.controller = False
        """A Monarch controller: its flush fans out to its actors."""
        self.driven = False
        """A Monarch actor process: its controller closes its steps."""
        self.closed = RecentSteps()

    @property
    def current(self) -> int | None:
        """The step in progress: ``set_step``'s, else the one after the last closed step, else None."""
        if self.explicit is not None:
            return self.explicit
        return None if self.last is None else self.last + 1

    @property
    def next(self) -> int:
        """The step the next automatic close gets."""
        return 0 if self.last is None else self.last + 1

    @property
    def periodic(self) -> bool:
        """Whether values go out every export interval without a step: only in a program that has
        neither closed a step nor announced one (``set_step``: it will flush it, and what it
        recorded goes out then, stamped with it) and whose steps no controller closes."""
        return not self.flushed and self.explicit is None and not self.monarch

    @property
    def monarch(self) -> bool:
        """A Monarch controller or actor: steps come from the controller's ``flush``, so values
        wait for it instead of going out early without a step (periodic exports)."""
        return self.controller or self.driven

    def close(self, step: int) -> None:
        self.last, self.explicit, self.flushed = step, None, True
        closed = self.closed
        set.add(closed, step)  # ``RecentSteps.add``, inlined: every flush comes here
        if len(closed) > RecentSteps.LIMIT:
            closed.trim()


class RecentSteps(set[int]):
    """The steps closed lately (bounded: only a late controller flush asks)."""

    LIMIT = 1024

    def add(self, step: int) -> None:
        super().add(step)
        if len(self) > self.LIMIT:
            self.trim()

    def trim(self) -> None:
        """Forget the older half."""
        for old in sorted(self)[: self.LIMIT // 2]:
            self.discard(old)
