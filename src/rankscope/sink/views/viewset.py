"""A run's views (``ViewSet``): its backends made from the run's config, opened (``init``) on first
need, finished and made fresh again on a release (they give their files back), finished for good
on close.

A view that names no logging mode is global here (what a sink is for: ``{"console": {}}`` prints what
the default console prints). A view whose configuration is bad (an unknown backend, a bad option,
its package missing) is off from the start, with one line naming it and why, in the log and the
status route, while the run's other views go on; one whose ``init`` fails
(W&B without an API key, say) or that turns itself off is disabled with one error naming it, and
stays off through releases.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...backends.base import LoggerBackend, LoggingMode, make_view
from ..checked import OnError
from .calls import BackendView, Calls

log = logging.getLogger("rankscope.sink")


class ViewSet:
    """One run's views and whether they are open; ``on_open`` is called before they open (again)
    and ``on_closed`` after they finished: the sink's descriptor budget (``durable.descriptors``)
    counts their files."""

    def __init__(
        self,
        experiment: str,
        config: Mapping[str, Mapping[str, Any]],
        on_error: OnError,
        calls: Calls,
        *,
        on_open: Callable[[], object] | None = None,
        on_closed: Callable[[], object] | None = None,
        run: str = "",
    ) -> None:
        self.experiment = experiment
        self.run = run
        self._config = config
        self._calls = calls
        self._on_open = on_open
        self._on_closed = on_closed
        self.opened = False
        self.opens = 0
        self.views: list[BackendView] = []
        for name, options in config.items():
            try:
                backend = make_view(name, options, mode=LoggingMode.GLOBAL_REDUCE)
            except (ValueError, ImportError) as exc:  # the config's fault: said in one line, the other views go on
                view = BackendView(name, LoggerBackend())
                view.disabled, view.last_error = True, str(exc)[:500]
                log.error("rankscope sink: view %r of %s is off: %s", name, experiment[:64], view.last_error)
            except Exception as exc:
                on_error(f"view {name!r} of {experiment[:64]!r}: bad configuration", exc)
                continue
            else:
                view = BackendView(name, backend)
            self.views.append(view)

    @property
    def descriptors(self) -> int:
        """File descriptors the views hold while open (``LoggerBackend.descriptors``)."""
        return sum(v.backend.descriptors for v in self.views if not v.disabled)

    def status(self) -> dict[str, Any]:
        return {view.name: view.status() for view in self.views}

    def open(self) -> None:
        self.opened = True
        self.opens += 1
        if self._on_open is not None:
            self._on_open()
        self._init_views()

    def release(self) -> None:
        """Finish the backends and make fresh ones from the config, to open on the next message that
        needs them (a view switched off stays off)."""
        if not self.opened:
            return
        try:
            self._finish_views()
        finally:
            self.opened = False
            if self._on_closed is not None:
                self._on_closed()
        for view in self.views:
            if not view.disabled:
                view.backend = make_view(view.name, self._config[view.name], mode=LoggingMode.GLOBAL_REDUCE)

    def close(self) -> None:
        """Finish the backends, if open, for good."""
        try:
            if self.opened:
                self._finish_views()
        finally:
            if self._on_closed is not None:
                self._on_closed()

    def _init_views(self) -> None:
        """Init every view, disabling those whose init fails or that turn themselves off, and log which
        are on (the first time: views opened again after a release are not news)."""
        for view in self.views:
            if view.disabled:
                continue
            if not self._calls.call(
                view, view.backend.init, "global", experiment=self.experiment, run=self.run, role="sink"
            ):
                view.disabled = True
            elif view.backend.off_reason:  # the backend turned itself off (and logged why)
                view.disabled = True
                view.last_error = view.backend.off_reason[:500]
                continue
            if view.disabled:
                log.error(
                    "rankscope sink: view %r of %s is off: its init failed (%s)",
                    view.name,
                    self.experiment[:64],
                    view.last_error,
                )
        where = ", ".join(f"{v.name} -> {v.backend.location or '?'}" for v in self.views if not v.disabled)
        run = f" run {self.run[:64]}" if self.run else ""
        if self.opens == 1 and (said := _NEW_RUNS.say()) is not None:
            more = f" (and {said} more new runs not said in the last {_NEW_RUNS.interval:g} s)" if said else ""
            log.info(
                "rankscope sink: new experiment %s%s: %s%s", self.experiment[:256], run, where or "no view is on", more
            )
        else:
            log.debug("rankscope sink: views of %s%s opened: %s", self.experiment[:256], run, where or "no view is on")

    def _finish_views(self) -> None:
        live = [view for view in self.views if not view.disabled]
        for view in live:  # the views that drain from threads of their own start at once
            self._calls.call(view, view.backend.finishing)
        for view in live:
            if not view.disabled:
                self._calls.call(view, view.backend.finish)


class SaidLines:
    """At most ``most`` lines per ``interval`` seconds (a flood of new runs writes a few lines, not
    one per run); ``say`` is None when a line is not to be said now, else how many were not since."""

    def __init__(self, most: int = 10, interval: float = 10.0) -> None:
        self.most, self.interval = most, interval
        self._lock = threading.Lock()
        self._since = -math.inf
        self._said = 0
        self._unsaid = 0

    def say(self) -> int | None:
        with self._lock:
            now = time.monotonic()
            if now - self._since >= self.interval:
                self._since, self._said = now, 0
            if self._said >= self.most:
                self._unsaid += 1
                return None
            self._said += 1
            unsaid, self._unsaid = self._unsaid, 0
            return unsaid


_NEW_RUNS = SaidLines()
"""The sink-wide bound on "new experiment" lines (the status route lists every run)."""
