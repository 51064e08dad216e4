"""Telemetry never takes the job down: warnings and internal errors that cannot raise.

Under ``python -W error`` (or pytest's ``filterwarnings = error``) ``warnings.warn`` raises;
on the export thread that would kill the thread, and in ``flush`` it would escape into the
training loop. So every rankscope warning goes through ``warn``, which falls back to logging
when the warning filter turns it into an exception.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
import warnings
from types import FrameType
from typing import Any

log = logging.getLogger("rankscope")

internal_errors: list[str] = []
"""Internal errors seen in this process (most recent last, bounded); tests assert it stays empty."""

_warned: set[str] = set()


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""rankscope's own source files start with this: a warning never points at one of them."""

_registry: dict[Any, Any] = {}
"""The warnings registry of warnings no line of the user's code led to (the export thread's, exit's)."""


def warn(message: str, stacklevel: int = 2) -> None:
    """A ``RuntimeWarning`` for the user, attributed to the user's line that led to it (the first
    frame outside rankscope), or to ``rankscope`` itself when none did (the export thread, exit):
    never to a line of rankscope's, whose source Python would print under the message.
    Logged instead when warnings are errors. (``stacklevel`` is kept for callers; the frame
    is found by walking out of the package.)"""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename == threading.__file__:
        frame = None  # a thread rankscope started: no line of the user's led here
    try:
        if frame is None:
            warnings.warn_explicit(message, RuntimeWarning, "rankscope", 0, module="rankscope", registry=_registry)
        else:
            warnings.warn_explicit(
                message,
                RuntimeWarning,
                frame.f_code.co_filename,
                frame.f_lineno,
                module=frame.f_globals.get("__name__", "<string>"),
                registry=frame.f_globals.setdefault("__warningregistry__", {}),
            )  # no module_globals: a loader's get_source may raise (``python -c``'s __main__), as warn's never does
    except Warning:
        log.warning(message)


def warn_once(message: str, stacklevel: int = 2) -> None:
    """``warn``, once per distinct message per process."""
    if message not in _warned:
        _warned.add(message)
        warn(message, stacklevel + 1)


def report_internal_error(where: str, exc: BaseException) -> None:
    """A bug or an unexpected failure inside rankscope: counted, warned about, never raised."""
    message = f"rankscope: internal error in {where}: {exc!r}"
    internal_errors.append(message)
    del internal_errors[:-100]
    if "PYTEST_CURRENT_TEST" in os.environ:  # loud in our own tests
        traceback.print_exception(exc)
    warn(message, stacklevel=3)
