"""Regression tests for the SDK bugs of issue 13 (item 3), each failing on 27b5011 (the layout move
before the runtime-slot refactor):

- Internal errors were ``warnings.warn``: under ``python -W error`` the first one killed the
  export thread (every later step lost) or escaped ``flush()`` into the training loop.
- ``set_step(N)`` moved the tracing step but not ``current_step()``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import rankscope as rs

from ..conftest import run_python


class _Collect(rs.LoggerBackend):
    """Keeps every reduced batch in memory: ``[(step, {key: value})]``."""

    batches: ClassVar[list[tuple[int | None, dict[str, float]]]] = []

    def log_batch(self, metrics: list[Any], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        _Collect.batches.append((global_step, {m.key: m.value for m in metrics}))


# -- 1. re-init keeps the recorder: key registry, deferred GPU timings, device values ----------


# -- 2. internal errors under `python -W error` -------------------------------------------------

_W_ERROR_CHILD = """
import os
import sys

import rankscope as rs
from rankscope.metrics.recording import add_flush_hook

assert sys.warnoptions == ["error"], sys.warnoptions
broken = os.environ["BROKEN"]


def broken_hook():
    raise RuntimeError("a flush hook broke")


class Flaky(rs.LoggerBackend):
    def log_batch(self, metrics, global_step, *args, **kwargs):
        if global_step == 0 and broken in ("backend", "both"):
            raise RuntimeError("a backend broke at step 0")
        print(f"logged step {global_step}: {[(m.key, m.value) for m in metrics]}", flush=True)


if broken in ("hook", "both"):
    add_flush_hook(broken_hook)
rs.register_backend("flaky", Flaky)
rs.init(backends={"flaky": {"logging_mode": "per_rank_reduce"}})
for step in range(3):
    rs.record_metric("loss", float(step))
    rs.flush(step)
print(f"force_flush {rs.force_flush(5)}", flush=True)
rs.shutdown()
print("done", flush=True)
"""


@pytest.mark.parametrize("broken", ["backend", "hook", "both"])
def test_internal_errors_under_w_error_neither_kill_export_nor_escape_flush(broken: str) -> None:
    """Bug: ``_report_internal_error`` used ``warnings.warn``; under ``python -W error`` an error
    in a backend's ``log_batch`` killed the export thread (steps 1 and 2 never arrived) and one
    in a flush hook raised out of ``flush()``. Now both are logged and the job goes on."""
    # PYTHONWARNINGS=error is ``python -W error`` (the child checks that it took effect).
    result = run_python(_W_ERROR_CHILD, env={"BROKEN": broken, "PYTHONWARNINGS": "error"}, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout.splitlines()
    if broken == "hook":
        assert "logged step 0: [('loss', 0.0)]" in out
    assert "logged step 1: [('loss', 1.0)]" in out, result.stdout + result.stderr[-3000:]
    assert "logged step 2: [('loss', 2.0)]" in out
    assert "force_flush True" in out and out[-1] == "done"
    if broken in ("backend", "both"):
        assert "rankscope: internal error in _prepare: RuntimeError('a backend broke at step 0')" in result.stderr
    if broken in ("hook", "both"):
        assert (
            "rankscope: internal error in flush hook broken_hook: RuntimeError('a flush hook broke')" in result.stderr
        )


# -- 3. every setting validated, arguments included ----------------------------------------------


# -- 4. one step clock ---------------------------------------------------------------------------


def test_set_step_moves_current_step_and_the_span_step_together(make_sink: Any) -> None:
    """Bug: ``set_step(7)`` changed the step spans hang under but not ``current_step()``."""
    sink = make_sink()
    rs.init(experiment="set-step", endpoint=sink.endpoint)
    rs.flush(0)
    assert rs.current_step() == 1
    rs.set_step(7)
    assert rs.current_step() == 7
    with rs.trace("eval"):
        pass
    rs.flush(7)
    assert rs.current_step() == 8
    with rs.trace("after"):
        pass
    rs.flush(8)
    rs.shutdown()
    sink.finalize("set-step")
    assert sink.wait_written("set-step")
    steps = {s.name: s.step for s in sink.spans("set-step") if s.name != "step"}
    assert steps == {"eval": 7, "after": 8}
