"""What the MLflow view sends, as ``log-batch`` requests within MLflow's limits (pure).

MLflow refuses a ``log-batch`` request with more than 1,000 metrics, 100 params, 100 tags or
1,000 entities in all, or over 1 MB of JSON (``mlflow.utils.validation``: ``MAX_METRICS_PER_BATCH``,
``MAX_PARAMS_TAGS_PER_BATCH``, ``MAX_ENTITIES_PER_BATCH``, ``MAX_BATCH_LOG_REQUEST_SIZE``); a
param's value is at most 6,000 characters and a tag's 8,000 (``MAX_PARAM_VAL_LENGTH``,
``MAX_TAG_VAL_LENGTH``). ``take`` cuts the queue's head into requests under every one of them, so a
step of 2,500 keys is three requests, and a longer value is cut (with ``…`` at its end).
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

MAX_METRICS = 1000
MAX_PARAMS_TAGS = 100
MAX_ENTITIES = 1000
MAX_REQUEST_BYTES = 1_000_000
REQUEST_BYTES = 900_000
"""What a request of this view holds at most: under MLflow's 1 MB, with room for its envelope."""
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000


class MetricPoint(NamedTuple):
    key: str
    value: float
    timestamp_ms: int
    step: int
    target: str = ""
    """Which run: "" the run itself, else a child run's process label (``per_rank_reduce``)."""


class Param(NamedTuple):
    key: str
    value: str
    target: str = ""


class Tag(NamedTuple):
    key: str
    value: str
    target: str = ""


Entry = MetricPoint | Param | Tag


def cut(value: str, most: int) -> str:
    """``value`` at most ``most`` characters, ending in ``…`` when it was cut."""
    return value if len(value) <= most else value[: most - 1] + "…"


def param(key: str, value: Any, target: str = "") -> Param:
    return Param(key, cut(str(value), MAX_PARAM_VALUE), target)


def tag(key: str, value: Any, target: str = "") -> Tag:
    return Tag(key, cut(str(value), MAX_TAG_VALUE), target)


def _number(value: float) -> float | str:
    """A double as MLflow's JSON takes it: non-finite values as the strings protobuf's JSON reads."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _json(entry: Entry) -> dict[str, Any]:
    if isinstance(entry, MetricPoint):
        return {"key": entry.key, "value": _number(entry.value), "timestamp": entry.timestamp_ms, "step": entry.step}
    return {"key": entry.key, "value": entry.value}


@dataclass(slots=True)
class Batch:
    """One ``log-batch`` request's entries, all of one run (``target``)."""

    target: str
    metrics: list[dict[str, Any]] = field(default_factory=list)
    params: list[dict[str, Any]] = field(default_factory=list)
    tags: list[dict[str, Any]] = field(default_factory=list)
    entries: int = 0
    """Queue entries it holds (the head of the queue: popped once it is sent)."""
    bytes: int = 2

    def body(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "metrics": self.metrics, "params": self.params, "tags": self.tags}

    @property
    def points(self) -> int:
        return len(self.metrics)


def take(queue: deque[Entry], *, request_bytes: int = REQUEST_BYTES) -> Batch | None:
    """The next request from the head of ``queue`` (not popped): its longest prefix of one run's
    entries within every limit (module docstring); at least one entry. None: the queue is empty."""
    if not queue:
        return None
    batch = Batch(queue[0].target)
    params = isinstance(queue[0], Param)  # params go alone: MLflow refuses a whole request for one changed param
    for entry in queue:
        if entry.target != batch.target or isinstance(entry, Param) is not params:
            break
        row = _json(entry)
        size = len(json.dumps(row)) + 1
        if batch.entries and batch.bytes + size > request_bytes:
            break
        if isinstance(entry, MetricPoint):
            if len(batch.metrics) >= MAX_METRICS:
                break
            into = batch.metrics
        elif isinstance(entry, Param):
            if len(batch.params) >= MAX_PARAMS_TAGS:
                break
            into = batch.params
        else:
            if len(batch.tags) >= MAX_PARAMS_TAGS:
                break
            into = batch.tags
        if batch.entries >= MAX_ENTITIES:
            break
        into.append(row)
        batch.entries += 1
        batch.bytes += size
    return batch
