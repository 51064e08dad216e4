"""Regression tests for the SDK bugs of issue 13 (item 3), each failing on 27b5011 (the layout move
before the runtime-slot refactor) and, for the settings validation, on the code before this fix.

- Re-init lost the recorder's state: the key registry (a key recorded with MEAN then with
  MAX after ``init()`` again was folded into the MEAN value), deferred GPU timings and pending
  device values.
- Arguments bypassed settings validation: ``init(export_interval=-1)`` reached
  ``queue.get(timeout=-1)`` on the export thread, 0 busy-spun it, ``protocol="bogus"`` passed.

The two that need a child process or a sink are ``tests/integration/test_sdk_regressions.py``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import pytest
import torch

import rankscope as rs
from rankscope.core import runtime as rs_slot
from rankscope.core.settings import SETTINGS, Settings
from rankscope.tracing.gpu_timing import CudaTimingProcessor

from ..fake_cuda import FakeCuda


class _Collect(rs.LoggerBackend):
    """Keeps every reduced batch in memory: ``[(step, {key: value})]``."""

    batches: ClassVar[list[tuple[int | None, dict[str, float]]]] = []

    def log_batch(self, metrics: list[Any], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        _Collect.batches.append((global_step, {m.key: m.value for m in metrics}))


@pytest.fixture
def collected() -> list[tuple[int | None, dict[str, float]]]:
    """A local ``per_rank_reduce`` backend named ``regressions``; its batches, once force-flushed."""
    _Collect.batches = []
    rs.register_backend("regressions", _Collect)
    return _Collect.batches


_VIEWS = {"regressions": {"logging_mode": "per_rank_reduce"}}


# -- 1. re-init keeps the recorder: key registry, deferred GPU timings, device values ----------


def test_reinit_keeps_the_reduce_type_registry(collected: list[Any]) -> None:
    """Bug: after ``init()`` again, ``record_metric("x", 100, MAX)`` on a key recorded with MEAN
    was folded into the MEAN accumulator (MEAN(1, 3) then MAX(100) gave 34.67)."""
    rs.init(backends=_VIEWS)
    rs.record_metric("x", 1.0, rs.Reduce.MEAN)
    rs.record_metric("x", 3.0, rs.Reduce.MEAN)
    rs.init(backends=_VIEWS)
    with pytest.raises(ValueError, match=r"'x'.*Reduce\.MEAN.*Reduce\.MAX"):
        rs.record_metric("x", 100.0, rs.Reduce.MAX)
    rs.flush(0)
    assert rs.force_flush(10)
    assert collected == [(0, {"x": 2.0})]


def test_reinit_keeps_deferred_gpu_timings(collected: list[Any]) -> None:
    """Bug: a ``timer="gpu"`` phase recorded before ``init()`` again lost its duration (the
    deferred CUDA-event pair stayed in the old recorder). The GPU is ``tests/fake_cuda.py``."""
    rs.init(backends=_VIEWS)
    fake = FakeCuda()
    state = rs_slot.current.tracing  # type: ignore[union-attr]
    state._gpu, state._gpu_checked = CudaTimingProcessor(state.processor, fake), True  # type: ignore[arg-type]
    with rs.trace("train", timer="gpu") as t:
        fake.launch(30.0)
        t.step("fwd")
    rs.init(backends=_VIEWS)
    rs.flush(0)
    assert rs.force_flush(10)
    ((step, values),) = collected
    assert step == 0
    # The GPU's 30 ms (a CPU-timed phase would read ~0), kept through the second init.
    assert values["train/fwd/duration_avg_s"] > 0.029
    assert values["train/total_duration_max_s"] > 0.029


@pytest.mark.gpu
def test_reinit_keeps_pending_cuda_values(collected: list[Any]) -> None:
    """Bug: CUDA tensor values recorded before ``init()`` again (read only at flush) were lost."""
    rs.init(backends=_VIEWS)
    rs.record_metric("gpu_loss", torch.tensor(2.5, device="cuda"), rs.Reduce.SUM)
    rs.init(backends=_VIEWS)
    rs.flush(0)
    assert rs.force_flush(10)
    assert collected == [(0, {"gpu_loss": 2.5})]


# -- 2. internal errors under `python -W error` -------------------------------------------------


# -- 3. every setting validated, arguments included ----------------------------------------------


@pytest.mark.parametrize("interval", [-1, 0, -0.5, math.nan, math.inf, True, "soon"])
def test_init_validates_export_interval_argument(interval: Any) -> None:
    """Bug: ``init(export_interval=-1)`` reached ``queue.get(timeout=-1)`` on the export thread
    and 0 busy-spun it: arguments skipped the parser that ``RANKSCOPE_EXPORT_INTERVAL`` goes through."""
    rs.init()
    rs.flush(0)
    with pytest.raises(ValueError, match=r"^export_interval="):
        rs.init(export_interval=interval)
    assert rs.current_step() == 1  # a refused init changed nothing: the runtime before it goes on


def test_init_validates_protocol_argument() -> None:
    """Bug: ``init(protocol="bogus")`` was taken as is."""
    with pytest.raises(ValueError, match=r"^protocol='bogus': must be 'grpc' or 'http/protobuf'"):
        rs.init(protocol="bogus")
    assert rs_slot.current is None


@pytest.mark.parametrize(
    ("variable", "text"),
    [("RANKSCOPE_EXPORT_INTERVAL", "nan"), ("RANKSCOPE_SHUTDOWN_TIMEOUT", "inf"), ("RANKSCOPE_AUTO_STEP", "maybe")],
)
def test_environment_values_go_through_the_same_parsers(
    monkeypatch: pytest.MonkeyPatch, variable: str, text: str
) -> None:
    """Bug (same one): a NaN interval and an infinite shutdown timeout passed ``> 0``, and a bool
    setting read anything it did not know as false."""
    monkeypatch.setenv(variable, text)
    with pytest.raises(ValueError, match=f"^{variable}='{text}': must be"):
        rs.init()


def test_settings_object_is_frozen_validated_and_matches_the_table() -> None:
    """The one settings object: a field per row of ``SETTINGS``, checked however it is made."""
    assert [f.name for f in dataclasses.fields(Settings)] == [s.name for s in SETTINGS]
    settings = Settings.load({"export_interval": "0.25", "replica": 2}, environ={"OTEL_SERVICE_NAME": "generator"})
    assert (settings.export_interval, settings.replica, settings.role) == (0.25, "2", "generator")
    assert settings.protocol == "grpc" and settings.max_queued_steps == 300
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.export_interval = 5.0  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"^shutdown_timeout=-1: must be a number > 0"):
        dataclasses.replace(settings, shutdown_timeout=-1)
    with pytest.raises(TypeError, match="export_intervall"):
        Settings.load({"export_intervall": 1.0})


# -- 4. one step clock ---------------------------------------------------------------------------
