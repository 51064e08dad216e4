"""The latest policy version this process knows of, carried with every Monarch call.

The trainer (or the controller) says which policy version is the newest with
``rankscope.rl.set_policy_version``; every endpoint call carries the caller's number, and
the callee keeps the highest it has seen. A generator can then report how stale the
weights it samples with are, without asking the trainer (``rankscope.rl.generation``).
"""

from __future__ import annotations

_latest: int | None = None
_in_use: int | None = None


def latest_policy_version() -> int | None:
    return _latest


def set_policy_version(version: int) -> None:
    global _latest
    _latest = version


def observe_policy_version(version: int) -> None:
    """A caller's number arrived: keep the highest (calls may arrive out of order)."""
    global _latest
    if _latest is None or version > _latest:
        _latest = version


def use_policy_version(version: int) -> None:
    """This process now acts with the weights of ``version`` (a generator after a pull)."""
    global _in_use
    _in_use = version
    observe_policy_version(version)


def policy_version_in_effect() -> int | None:
    """The version this process acts with: the weights it pulled, else the newest it knows of."""
    return _in_use if _in_use is not None else _latest
