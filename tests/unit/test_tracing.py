"""``trace``/``Tracer`` in a lone process with no sink: metrics only, no spans to send.

The rest, against a real sink, is ``tests/integration/test_tracing.py``."""

from __future__ import annotations

import rankscope as rs


def test_a_lone_process_without_a_sink_records_metrics_only(capsys) -> None:
    rs.init(experiment="alone", backends={"console": {"logging_mode": "global_reduce", "format": "full"}})
    with rs.trace("solo") as t:
        t.step("x")
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "solo/x/duration_avg_s" in out and "solo/total_duration_max_s" in out


def test_an_unsampled_blocks_total_is_from_its_start_not_its_last_phase(tmp_path) -> None:
    """Without an endpoint no span is sampled; the total still spans the whole block (it was
    measured from the last ``step`` once: 10 ms for a 60 ms block)."""
    import json
    import time

    out = tmp_path / "rank.jsonl"
    rs.init(experiment="alone", backends={"jsonl": {"logging_mode": "per_rank_reduce", "path": str(out)}})
    with rs.trace("block") as t:
        time.sleep(0.05)
        t.step("slow")
        time.sleep(0.01)
        t.step("fast")
    rs.flush(0)
    rs.shutdown()
    view = {row["key"]: row["value"] for row in map(json.loads, out.read_text().splitlines())}
    phases = view["block/slow/duration_max_s"] + view["block/fast/duration_max_s"]
    assert view["block/total_duration_max_s"] >= phases >= 0.06


def test_a_phase_named_none_is_a_phase_not_the_blocks_end(tmp_path) -> None:
    """A phase tuple marks the block's own end with ``None``: ``t.step(None)`` is the phase "None"
    (it once folded the phase into the block's total and sent the block's span twice)."""
    import json
    import time

    out = tmp_path / "rank.jsonl"
    rs.init(experiment="alone", backends={"jsonl": {"logging_mode": "per_rank_reduce", "path": str(out)}})
    with rs.trace("blk") as t:
        time.sleep(0.01)
        t.step(None)  # type: ignore[arg-type]
        time.sleep(0.03)
    rs.flush(0)
    rs.shutdown()
    view = {row["key"]: row["value"] for row in map(json.loads, out.read_text().splitlines())}
    assert view["blk/None/duration_max_s"] < 0.03 <= view["blk/total_duration_max_s"]
    assert view["blk/total_duration_avg_s"] == view["blk/total_duration_max_s"]


def test_the_clock_offset_is_read_between_the_closest_monotonic_reads(monkeypatch) -> None:
    """A process preempted between its clock reads at import (5 ms here, on the first try) must not
    carry that gap into its spans' wall times: the tightest bracket of the tries wins."""
    from rankscope.tracing import spans

    perf = iter([1_000, 5_001_000, 10_000_000, 10_000_200, 20_000_000, 20_000_900])
    wall = iter([7_000_000_500, 7_010_000_100, 7_020_000_450])
    monkeypatch.setattr(spans.time, "perf_counter_ns", lambda: next(perf))
    monkeypatch.setattr(spans.time, "time_ns", lambda: next(wall))
    assert spans._clock_offset(tries=3) == 7_010_000_100 - 10_000_100


def test_blocks_and_ids_made_ahead_follow_the_callers_steps_back_and_forth() -> None:
    """The export thread makes the coming steps' ids and root-level blocks from the caller's step:
    made once each (incrementally), the passed ones dropped, and made again from a step that went
    back (a second loop from step 0) or jumped ahead (``set_step``)."""
    from opentelemetry.sdk.resources import Resource

    from rankscope.core import names as attr
    from rankscope.steps.clock import StepClock
    from rankscope.tracing.spans import is_sampled, step_ids
    from rankscope.tracing.tracer import TracingState

    steps = StepClock()
    state = TracingState(
        Resource({attr.EXPERIMENT_ID: "ahead"}), steps, sample_ratio=1.0, root=False, max_spans=64, on_error=print
    )
    state.ahead.seen("train")

    def made() -> list[int]:
        return sorted(step for prefix, step in state.ahead.ready if prefix == "train")

    for last in (9, 10, 500, 0, 3):  # the caller flushed ``last`` as the export thread takes step ``last``
        steps.last = last
        state.taken(last, None)
        assert made() == list(range(last + 1, last + 33)), last
        block, context = state.ahead.ready[("train", last + 1)]
        trace_id, root_id = step_ids("ahead", 0, last + 1)
        assert (block.trace_id, block.up, block.step) == (trace_id, root_id, last + 1)
        assert block.sampled == is_sampled(trace_id, 1.0) and context.get(next(iter(context))) is block
        assert all(state._ids.get(s) is not None for s in range(last + 1, last + 33))
    steps.last = 60
    state.taken(20, None)  # the caller is 40 steps ahead of what the export thread takes: twice that
    assert made() == list(range(61, 61 + 2 * 40 + 8))


def test_a_prefix_whose_blocks_go_untaken_is_no_longer_made_ahead() -> None:
    """A root-level block seen once (a setup block) stops costing the export thread a block a step."""
    from opentelemetry.sdk.resources import Resource

    from rankscope.core import names as attr
    from rankscope.steps.clock import StepClock
    from rankscope.tracing.tracer import BlocksAhead, TracingState

    steps = StepClock()
    state = TracingState(
        Resource({attr.EXPERIMENT_ID: "idle"}), steps, sample_ratio=1.0, root=False, max_spans=64, on_error=print
    )
    state.ahead.seen("setup")
    state.ahead.seen("train")
    for last in range(BlocksAhead.IDLE_STEPS + 2):
        steps.last = last
        state.taken(last, None)
        assert state.ahead.ready.pop(("train", last + 1), None) is not None  # the loop's block is taken each step
    assert state.ahead.prefixes == ["train"]
    assert {prefix for prefix, _ in state.ahead.ready} == {"train"}
    state.ahead.seen("setup")  # used again: made again
    assert state.ahead.prefixes == ["train", "setup"]
