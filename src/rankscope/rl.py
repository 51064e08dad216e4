"""One-line helpers for RL generators, replay buffers and weight sync (names: ``rankscope.metrics.catalog``).

    rs.rl.set_policy_version(v)                       # trainer/controller: the newest policy
    with rs.rl.weight_sync("pull", version=v): ...    # generator: load weights (push: trainer)
    lineage = rs.rl.generation(tokens=n, latency_s=dt, sequence_lengths=lens, queue_depth=q)
    rs.rl.replay_buffer(size=len(buf), writes=k, evictions=e)
    rs.rl.consume(batch)                              # trainer: link this step to the generations

Lineage: ``generation`` returns the span context of the generation it records (the span active
there, e.g. the generator's Monarch endpoint span) with its policy version and token count.
Keep it with the samples (``sample["lineage"] = lineage``: it pickles, so it rides through a
replay buffer); when the trainer trains on them, ``consume(samples)`` gives the active span
(the trainer's step) OTel links to those generation spans, and records
``rl/staleness_tokens_weighted``.

Staleness needs no extra plumbing: every Monarch endpoint call carries the caller's newest
policy version, so a generator called by the controller knows it, and ``generation``
records newest minus the version of the weights it pulled.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .core import runtime as _slot
from .core.policy_version import latest_policy_version, policy_version_in_effect, use_policy_version
from .core.policy_version import set_policy_version as _set_latest
from .metrics.rates import RateMeter
from .metrics.recording import record_metric, record_weighted_mean
from .metrics.reduce import Reduce
from .tracing.tracer import close_span, link_active_span, open_span, tracing_of

_SUM, _MEAN, _MAX, _DIST = Reduce.SUM, Reduce.MEAN, Reduce.MAX, Reduce.DISTRIBUTION
_generated = RateMeter("generator/tokens_per_s")
_weights_version: int | None = None
"""The version of the weights this generator pulled last."""
MAX_LINKS = 128
"""Links one span gets from ``consume`` (beyond: a uniform random choice, the rest counted)."""


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a sample came from: the generation span (OTel trace and span id), the policy version
    it was generated with and how many tokens it holds. Plain ints: it pickles across actors."""

    trace_id: int
    span_id: int
    policy_version: int | None = None
    tokens: int | None = None


def lineage(*, tokens: int | None = None, policy_version: int | None = None) -> Lineage:
    """The active span's context as a sample's lineage (``generation`` returns one too).

    ``policy_version`` defaults to the version in effect here (the generator's pulled weights)."""
    version = policy_version_in_effect() if policy_version is None else _check_int("policy_version", policy_version)
    runtime = _slot.get()
    if runtime is None:
        return Lineage(0, 0, version, tokens)
    scope = tracing_of(runtime).scope()
    return Lineage(scope.trace_id, scope.parent_id, version, None if tokens is None else _check_int("tokens", tokens))


def consume(samples: Iterable[Any], *, max_links: int = MAX_LINKS) -> int:
    """The trainer trains on ``samples``: link the active span (its step) to their generations.

    Each sample is a ``Lineage``, has one as ``.lineage``, or is a mapping with a ``"lineage"``
    key; others are skipped. Adds one OTel span link per distinct generation span (at most
    ``max_links`` per span: beyond, a uniform random choice, the rest counted in
    ``rl/lineage_links_dropped`` and the span's ``rankscope.links.dropped``), and records
    ``rl/staleness_tokens_weighted``: newest policy version minus each sample's, weighted by its
    tokens (1 when unknown), exact across ranks. Returns the links dropped.
    """
    found: list[Lineage] = []
    for sample in samples:
        item = sample if isinstance(sample, Lineage) else None
        if item is None:
            item = sample.get("lineage") if isinstance(sample, Mapping) else getattr(sample, "lineage", None)
        if isinstance(item, Lineage):
            found.append(item)
    if not found:
        return 0
    newest = latest_policy_version()
    for item in found:
        if newest is not None and item.policy_version is not None:
            weight = item.tokens if item.tokens is not None else 1
            record_weighted_mean("rl/staleness_tokens_weighted", max(0, newest - item.policy_version), weight)
    dropped = link_active_span([(item.trace_id, item.span_id) for item in found], max_links)
    record_metric("rl/lineage_links_dropped", dropped, _SUM)  # 0 too: the view says none were lost
    return dropped


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
) -> Lineage:
    """Record one generation request (or a batch of ``requests``) on a generator replica;
    returns its ``Lineage`` (the active span's context) to keep with the samples it produced.

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
    return lineage(tokens=tokens, policy_version=used)


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
                use_policy_version(self.version)


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


__all__ = [
    "Lineage",
    "consume",
    "generation",
    "lineage",
    "policy_staleness",
    "replay_buffer",
    "set_policy_version",
    "weight_sync",
]
