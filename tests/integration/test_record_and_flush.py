"""A custom async backend registered by class: its coroutines run and it gets every step."""

from __future__ import annotations

from typing import ClassVar

import rankscope as rs


class AsyncCollect(rs.LoggerBackend):
    """A Forge-style backend with async methods, registered by the user."""

    batches: ClassVar[list] = []

    async def init(self, process_name=None, *args, **kwargs):
        self.process_name = process_name

    async def log_batch(self, metrics, global_step, *args, **kwargs):
        AsyncCollect.batches.append((global_step, {m.key: m.value for m in metrics}))


def test_custom_async_backend_registered_by_class() -> None:
    rs.register_backend("collect", AsyncCollect)
    rs.init(backends={"collect": {"logging_mode": "per_rank_reduce"}})
    rs.record_metric("x", 2.0, rs.Reduce.MIN)
    rs.flush(1)
    assert rs.force_flush(10)
    assert AsyncCollect.batches == [(1, {"x": 2.0})]








