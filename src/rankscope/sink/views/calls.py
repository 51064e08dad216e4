"""Calls into a run's views, guarded: a call that fails is counted on its view (``BackendView``:
what the status route says about it), logged once and then rarely, and never raised; a backend
whose call returns an awaitable has it run to completion on the run's own event loop."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from ...backends.base import LoggerBackend
from ..checked import OnError


class BackendView:
    """One backend and what the status route says about it."""

    __slots__ = ("backend", "disabled", "failures", "last_error", "name", "written_step")

    def __init__(self, name: str, backend: LoggerBackend) -> None:
        self.name, self.backend = name, backend
        self.written_step = -1
        self.failures = 0
        self.last_error: str | None = None
        self.disabled = False

    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "location": self.backend.location,
            "last_written_step": self.written_step,
            "failures": self.failures,
            "last_error": self.last_error,
            "disabled": self.disabled,
        }
        try:
            health = self.backend.health()
        except Exception as exc:  # the status route answers whatever a backend does
            health = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        if health is not None:
            found["health"] = health
        return found


class Calls:
    """The guarded calls of one run's views (on the thread that handles its inbox)."""

    def __init__(self, experiment: str, on_error: OnError) -> None:
        self.experiment = experiment
        self._on_error = on_error
        self._loop: asyncio.AbstractEventLoop | None = None

    def call(self, view: BackendView, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                self._loop.run_until_complete(result)
            return True
        except Exception as exc:
            view.failures += 1
            view.last_error = f"{type(exc).__name__}: {exc}"[:500]
            if view.failures == 1 or view.failures % 1000 == 0:  # logged once, then rarely; always counted
                self._on_error(f"view {view.name!r} of {self.experiment[:64]!r} ({fn.__name__})", exc)
            return False

    def answer(self, view: BackendView, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` called as ``call`` calls it; its answer, None if it failed."""
        answer: list[Any] = []

        def call() -> None:
            answer.append(fn(*args))

        call.__name__ = fn.__name__
        self.call(view, call)
        return answer[0] if answer else None

    def close(self) -> None:
        """The views are finished: close the event loop, if one was needed."""
        if self._loop is not None:
            self._loop.close()
