"""One-line helpers for RL generators, replay buffers and weight sync (names: ``rankscope.catalog``).

    rs.rl.set_policy_version(v)                       # trainer/controller: the newest policy
    with rs.rl.weight_sync("pull", version=v): ...    # generator: load weights (push: trainer)
    rs.rl.generation(tokens=n, latency_s=dt, sequence_lengths=lens, queue_depth=q)
    rs.rl.replay_buffer(size=len(buf), writes=k, evictions=e)

Staleness needs no extra plumbing: every Monarch endpoint call carries the caller's newest
policy version, so a generator called by the controller knows it, and ``generation``
records newest minus the version of the weights it pulled.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from .core.policy_version import latest_policy_version, observe_policy_version
from .core.policy_version import set_policy_version as _set_latest
from .metrics.rates import RateMeter
from .metrics.recording import record_metric
from .metrics.reduce import Reduce
from .tracing.tracer import close_span, open_span

_SUM, _MEAN, _MAX, _DIST = Reduce.SUM, Reduce.MEAN, Reduce.MAX, Reduce.DISTRIBUTION
_generated = RateMeter("generator/tokens_per_s")
_weights_version: int | None = None


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"rankscope.rl: {name} must be a non-negative int, got {value!r}")
    return value


def set_policy_version(version: int) -> None:
    """Say that ``version`` is the newest policy (the trainer after an update, or the controller).

    Records ``policy/version`` and travels with every Monarch call this process makes.
    """
    _set_latest(_check_int("version", version))
    record_metric("policy/version", version, _MAX)


def policy_staleness(version_used: int) -> int | None:
    """Newest known policy version minus ``version_used`` (None before any version is known)."""
    latest = latest_policy_version()
    return None if latest is None else max(0, latest - version_used)


def generation(
    *,
    tokens: int,
    latency_s: float | None = None,
    sequence_lengths: Iterable[int] | None = None,
    queue_depth: int | None = None,
    policy_version: int | None = None,
    requests: int = 1,
) -> None:
    """Record one generation request (or a batch of ``requests``) on a generator replica.

    Args:
        tokens: tokens generated.
        latency_s: request latency (``generator/request_latency_s``, a distribution).
        sequence_lengths: lengths of the generated sequences (``generator/sequence_length``).
        queue_depth: requests waiting in this replica's queue.
        policy_version: version of the weights used (default: the last ``weight_sync("pull")``);
            gives ``generator/policy_staleness``.
        requests: how many requests this call stands for.
    """
    record_metric("generator/tokens", _check_int("tokens", tokens), _SUM)
    _generated.add(tokens)
    record_metric("generator/requests", _check_int("requests", requests), _SUM)
    if latency_s is not None:
        record_metric("generator/request_latency_s", latency_s, _DIST)
    if sequence_lengths is not None:
        for length in sequence_lengths:
            record_metric("generator/sequence_length", length, _DIST)
    if queue_depth is not None:
        record_metric("generator/queue_depth", _check_int("queue_depth", queue_depth), _MAX)
    used = _weights_version if policy_version is None else _check_int("policy_version", policy_version)
    if used is not None:
        stale = policy_staleness(used)
        if stale is not None:
            record_metric("generator/policy_staleness", stale, _MAX)


class weight_sync:  # noqa: N801 - used like a function: with rs.rl.weight_sync("pull"):
    """Time a weight transfer: ``"push"`` (trainer → generators) or ``"pull"`` (generator).

    Records ``trainer/weight_push_s`` or ``generator/weight_pull_s`` and a ``weight_sync/push``
    or ``weight_sync/pull`` span. With ``version``: a push makes it the newest policy version,
    a pull makes it the version this generator samples with (for staleness).
    """

    def __init__(self, direction: str, version: int | None = None) -> None:
        if direction not in ("push", "pull"):
            raise ValueError(f"rankscope.rl.weight_sync: direction must be 'push' or 'pull', got {direction!r}")
        self.direction = direction
        self.version = None if version is None else _check_int("version", version)
        self._start = 0.0
        self._span: Any = None

    def __enter__(self) -> weight_sync:
        self._span = open_span(f"weight_sync/{self.direction}")
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        global _weights_version
        seconds = time.perf_counter() - self._start
        key = "trainer/weight_push_s" if self.direction == "push" else "generator/weight_pull_s"
        record_metric(key, seconds, _MAX)
        if self._span is not None:
            close_span(self._span, error=exc)
        if exc is None and self.version is not None:
            if self.direction == "push":
                set_policy_version(self.version)
            else:
                _weights_version = self.version
                observe_policy_version(self.version)


def replay_buffer(
    *,
    size: int | None = None,
    writes: int = 0,
    reads: int = 0,
    evictions: int = 0,
    read_latency_s: float | None = None,
) -> None:
    """Record replay-buffer activity: its size now and what was written/read/evicted since."""
    if size is not None:
        record_metric("replay_buffer/size", _check_int("size", size), _MAX)
    if writes:
        record_metric("replay_buffer/writes", _check_int("writes", writes), _SUM)
    if reads:
        record_metric("replay_buffer/reads", _check_int("reads", reads), _SUM)
    if evictions:
        record_metric("replay_buffer/evictions", _check_int("evictions", evictions), _SUM)
    if read_latency_s is not None:
        record_metric("replay_buffer/read_latency_s", read_latency_s, _MEAN)


__all__ = ["generation", "policy_staleness", "replay_buffer", "set_policy_version", "weight_sync"]
