"""``trace``/``Tracer`` against a real sink: spans, Forge metric names, errors, nesting with the
user's own OTel spans, events, explicit steps, sampling, TRACEPARENT into a child process, and the
GPU timer falling back to the CPU without CUDA."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

import rankscope as rs
from rankscope.tracing.spans import is_sampled, step_ids

from ..conftest import ROOT


def spans_of(sink: Any, experiment: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{sink.http_port}/rankscope/v1/spans?experiment={experiment}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return [json.loads(line) for line in response.read().decode().splitlines()]


def views_of(path: Any) -> dict[tuple[int, str], float]:
    return {(r["step"], r["key"]): r["value"] for r in map(json.loads, path.read_text().splitlines())}


@pytest.fixture
def traced(make_sink, tmp_path):
    out = tmp_path / "views.jsonl"
    sink = make_sink(backends={"jsonl": {"logging_mode": "global_reduce", "path": str(out)}})

    def start(experiment: str) -> Any:
        rs.init(experiment=experiment, endpoint=sink.endpoint)
        return sink

    start.out = out  # type: ignore[attr-defined]
    return start


def finish(sink: Any, experiment: str) -> list[dict[str, Any]]:
    rs.shutdown()
    sink.finalize(experiment)
    assert sink.wait_written(experiment)
    return spans_of(sink, experiment)


def test_tracer_metrics_spans_and_an_exception_inside(traced) -> None:
    sink = traced("names")
    t = rs.Tracer("loop").start()
    time.sleep(0.01)
    t.step("a")
    time.sleep(0.02)
    t.step("b")
    t.stop()
    with pytest.raises(KeyError), rs.trace("fails") as f:
        time.sleep(0.005)
        f.step("before")
        raise KeyError("boom")
    rs.flush(0)
    spans = finish(sink, "names")

    view = views_of(traced.out)
    assert 0.01 <= view[(0, "loop/a/duration_avg_s")] == view[(0, "loop/a/duration_max_s")] < 0.5
    assert 0.02 <= view[(0, "loop/b/duration_avg_s")] < 0.5
    assert (
        view[(0, "loop/total_duration_avg_s")]
        >= view[(0, "loop/a/duration_avg_s")] + view[(0, "loop/b/duration_avg_s")]
    )
    assert view[(0, "fails/before/duration_max_s")] >= 0.005
    assert view[(0, "fails/total_duration_max_s")] >= 0.005

    by_name = {s["name"]: s for s in spans}
    assert {"loop", "loop/a", "loop/b", "fails", "fails/before", "step"} <= set(by_name)
    assert by_name["loop/a"]["parent_span_id"] == by_name["loop"]["span_id"]
    assert by_name["loop/a"]["end_ns"] == by_name["loop/b"]["start_ns"]  # phases tile the block
    assert by_name["fails"]["error"] == "KeyError: 'boom'"
    assert by_name["fails/before"]["error"] is None
    trace_id, root_id = step_ids("names", 0, 0)
    assert {s["trace_id"] for s in spans} == {f"{trace_id:032x}"}
    assert by_name["loop"]["parent_span_id"] == by_name["step"]["span_id"] == f"{root_id:016x}"


def test_a_context_without_a_span_keeps_its_values_and_the_step_root(traced) -> None:
    """A block started under an OTel context that holds values but no span (baggage) hangs under
    the step's root span, and the context inside it keeps those values."""
    sink = traced("baggage")
    token = otel_context.attach(baggage.set_baggage("run", "a"))
    try:
        with rs.trace("inside"):
            seen = baggage.get_baggage("run")
            inner = otel_trace.get_current_span().get_span_context()
    finally:
        otel_context.detach(token)
    rs.flush(0)
    spans = finish(sink, "baggage")
    assert seen == "a"
    by_name = {s["name"]: s for s in spans}
    trace_id, root_id = step_ids("baggage", 0, 0)
    assert by_name["inside"]["parent_span_id"] == f"{root_id:016x}"
    assert by_name["inside"]["span_id"] == f"{inner.span_id:016x}" and inner.trace_id == trace_id


def test_decorators_user_spans_events_and_explicit_steps(traced) -> None:
    sink = traced("nesting")
    user = otel_trace.get_tracer("user-code")

    @rs.trace("reward")
    def reward(x: float) -> float:
        with user.start_as_current_span("user-span"):
            rs.record_event("scored", value=x)
        return x

    @rs.trace("rollout")
    async def rollout() -> float:
        await asyncio.sleep(0.001)
        return reward(1.0)

    assert asyncio.run(rollout()) == 1.0
    rs.flush(0)
    rs.set_step(7)  # explicit: the next spans belong to step 7
    with rs.trace("eval"):
        pass
    rs.flush(7)
    with rs.trace("after"):  # no set_step: the step after the last flushed one
        pass
    rs.flush(8)
    spans = finish(sink, "nesting")
    by_name = {s["name"]: s for s in spans if s["name"] != "step"}
    assert by_name["reward"]["parent_span_id"] == by_name["rollout"]["span_id"]
    assert by_name["user-span"]["parent_span_id"] == by_name["reward"]["span_id"]
    assert by_name["scored"]["parent_span_id"] == by_name["user-span"]["span_id"]
    assert by_name["scored"]["start_ns"] == by_name["scored"]["end_ns"]
    assert by_name["scored"]["attributes"]["value"] == 1.0
    assert by_name["user-span"]["step"] == 0  # the user's span joined the step through its trace id
    assert by_name["eval"]["step"] == 7 and by_name["eval"]["trace_id"] == f"{step_ids('nesting', 0, 7)[0]:032x}"
    assert by_name["after"]["step"] == 8
    with pytest.raises(TypeError):
        rs.set_step(-1)
    with pytest.raises(TypeError, match="attribute 'bad'"):
        rs.record_event("x", bad=[1, 2])
    with pytest.raises(ValueError, match="timer"):
        rs.trace("x", timer="tpu")


def test_sampling_keeps_the_same_steps_everywhere(make_sink, monkeypatch) -> None:
    sink = make_sink()
    monkeypatch.setenv("RANKSCOPE_TRACE_SAMPLE", "0.5")
    rs.init(experiment="sampled", endpoint=sink.endpoint)
    for step in range(40):
        with rs.trace("work"):
            pass
        rs.flush(step)
    kept = {s["step"] for s in finish(sink, "sampled")}
    expected = {step for step in range(40) if is_sampled(step_ids("sampled", 0, step)[0], 0.5)}
    assert kept == expected and 5 < len(kept) < 35  # a deterministic rule any other rank computes alike


def test_blocks_made_ahead_on_the_export_thread_hang_under_their_steps_root_each_with_its_own_id(traced) -> None:
    """Root-level blocks of the coming steps are made on the export thread (``BlocksAhead``): a block
    that takes one hangs under its step's root span with the step's trace id, a second block of the
    same step gets its own span id, and the user's span inside it is its child."""
    from rankscope.core import runtime

    sink = traced("ahead")
    user = otel_trace.get_tracer("user-code")
    state = runtime.get().tracing  # type: ignore[union-attr]
    taken = 0
    for step in range(12):
        made = state.ahead.ready.get(("loop", step))
        with rs.trace("loop") as block, user.start_as_current_span("inside"):
            pass
        taken += made is not None and block._scope is made[0]
        if step % 3 == 0:
            with rs.trace("loop"):  # a second block of the step: never the same one
                pass
        rs.flush(step)
        assert rs.force_flush(10)  # the export thread takes the step and makes the next ones' blocks
    spans = finish(sink, "ahead")
    assert taken >= 10  # from the second step on (the first block names the prefix to make)
    loops = [s for s in spans if s["name"] == "loop"]
    assert len(loops) == 12 + 4 and len({s["span_id"] for s in loops}) == 16
    for s in loops:
        trace_id, root_id = step_ids("ahead", 0, s["step"])
        assert s["trace_id"] == f"{trace_id:032x}" and s["parent_span_id"] == f"{root_id:016x}"
    assert sorted(s["step"] for s in loops) == sorted([*range(12), 0, 3, 6, 9])
    step_of = {s["span_id"]: s["step"] for s in loops}
    inside = [s for s in spans if s["name"] == "inside"]
    assert sorted(step_of[s["parent_span_id"]] for s in inside) == list(range(12))  # under its own step's block


CHILD = """
import rankscope as rs
rs.init()
with rs.trace("child-work"):
    pass
rs.shutdown()
"""


def test_traceparent_makes_a_child_process_span_a_child(make_sink, tmp_path) -> None:
    sink = make_sink()
    rs.init(experiment="parent-child", endpoint=sink.endpoint)
    with rs.trace("spawn"):
        env = rs.inject_env()
        child = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, cwd=ROOT, timeout=60, capture_output=True, text=True
        )
    assert child.returncode == 0, child.stderr
    rs.flush(0)
    spans = finish(sink, "parent-child")
    by_name = {s["name"]: s for s in spans}
    assert by_name["child-work"]["parent_span_id"] == by_name["spawn"]["span_id"]
    assert by_name["child-work"]["trace_id"] == by_name["spawn"]["trace_id"]
    assert by_name["child-work"]["pid"] != by_name["spawn"]["pid"]
    assert env["TRACEPARENT"].split("-")[2] == by_name["spawn"]["span_id"]


def test_gpu_timer_without_cuda_falls_back_to_cpu_with_one_warning(traced) -> None:
    sink = traced("gpu-fallback")
    with pytest.warns(RuntimeWarning, match="without CUDA"), rs.trace("g", timer="gpu") as t:
        t.step("phase")
    with rs.trace("g", timer="gpu") as t:  # no second warning (filterwarnings=error would raise)
        t.step("phase")
    rs.flush(0)
    spans = finish(sink, "gpu-fallback")
    assert sorted(s["name"] for s in spans) == ["g", "g", "g/phase", "g/phase", "step"]
    assert views_of(traced.out)[(0, "g/phase/duration_avg_s")] >= 0
