"""The encode stage: flushed steps into OTLP metric requests, pure (no thread, no socket, no clock).

``encode_steps`` turns the steps of one export round into requests of at most ``max_points``
points (a step is never split, so a backlog after an outage does not become one request beyond a
receiver's message size limit: gRPC's is 4 MiB), each step followed by its flush marker, the
process's goodbye after the last; the SDK MeterProvider's own request (the drop counter) leads the
first. The bytes come from ``otlp.templates.MetricEncoder``. Sample-row chunks are cut here too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..metrics.recorder import StepBatch
from ..metrics.samples import Kept
from ..otlp.templates import MetricEncoder

MAX_POINTS_PER_REQUEST = 8192
MAX_ROWS_PER_REQUEST = 512
MAX_ROW_CHARS_PER_REQUEST = 1 << 20
"""Sample rows go out in requests of at most this many rows and characters of text (4 KiB
strings, 64 fields: one row can be 256 KiB), under a receiver's 4 MiB message limit."""

SampleRow = tuple[str, str | None, int, Kept, int | None]
"""(table, rank_by, k, kept row, step): a sample row waiting for the endpoint."""


@dataclass(slots=True)
class Encoded:
    """One serialized metrics request and what it holds (for the step bound and the drop count)."""

    request: bytes
    steps: int
    points: int
    held_points: int


def encode_steps(
    encoder: MetricEncoder,
    batches: list[StepBatch],
    goodbye: bool,
    before: bytes = b"",
    max_points: int = MAX_POINTS_PER_REQUEST,
    pause: Callable[[], None] | None = None,
    exit_error: str | None = None,
    exit_step: int | None = None,
    after: int = 0,
) -> list[Encoded]:
    """The steps (oldest first) as requests; ``goodbye``: "this process is done" after the last
    (``exit_error``: the exception that ended it, in ``exit_step``);
    ``before``: a serialized request that leads the first one; ``pause`` runs between steps (the
    export thread hands the GIL back there); ``after``: the end of the last step encoded before,
    where these steps' data intervals start at the earliest (a periodic export does not move a
    step's start: its flush marker is timed from it, its points from the export before them,
    so delta intervals never overlap). Raises on a state it cannot encode."""
    made: list[Encoded] = []
    metrics: list[bytes] = []
    steps = points = held = 0
    for batch in batches:
        if points and points + len(batch.accs) > max_points:
            made.append(Encoded(encoder.request(metrics, before), steps, points, held))
            metrics, before, steps, points, held = [], b"", 0, 0, 0
        t0, t1 = batch.start_time_unix_nano, batch.time_unix_nano
        metrics += encoder.step(batch.step, max(t0, min(after, t1)), t1, batch.accs)
        after = t1
        if batch.step is not None:  # "this process closed step N" (value: number of keys)
            metrics.append(encoder.marker(batch.step, len(batch.accs), t0, t1, batch.expected, batch.driven))
        steps, points, held = steps + 1, points + len(batch.accs), held + batch.held_points
        if pause is not None:
            pause()
    if goodbye:
        metrics.append(encoder.goodbye(exit_error, exit_step))
    if metrics or before:
        made.append(Encoded(encoder.request(metrics, before), steps, points, held))
    return made


def row_chunk(held: deque[SampleRow]) -> list[SampleRow]:
    """Take the next request's rows from the front of ``held``: at most ``MAX_ROWS_PER_REQUEST`` rows
    and ``MAX_ROW_CHARS_PER_REQUEST`` characters of text (always at least one row)."""
    chunk: list[SampleRow] = []
    chars = 0
    while held and len(chunk) < MAX_ROWS_PER_REQUEST:
        row = held[0][3].row
        size = sum(len(v) for v in row.values() if isinstance(v, str)) + 16 * len(row)
        if chunk and chars + size > MAX_ROW_CHARS_PER_REQUEST:
            break
        chunk.append(held.popleft())
        chars += size
    return chunk
