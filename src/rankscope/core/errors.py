"""Telemetry never takes the job down: warnings and internal errors that cannot raise.

Under ``python -W error`` (or pytest's ``filterwarnings = error``) ``warnings.warn`` raises;
on the export thread that would kill the thread, and in ``flush`` it would escape into the
training loop. So every rankscope warning goes through ``warn``, which falls back to logging
when the warning filter turns it into an exception.
"""

from __future__ import annotations

import logging
import os
import traceback
import warnings

log = logging.getLogger("rankscope")

internal_errors: list[str] = []
"""Internal errors seen in this process (most recent last, bounded); tests assert it stays empty."""

_warned: set[str] = set()


def warn(message: str, stacklevel: int = 2) -> None:
    """A ``RuntimeWarning`` for the user; logged instead when warnings are errors."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
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
