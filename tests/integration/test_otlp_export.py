"""Recorded values leave the process as OTLP through the SDK's real exporters."""

from __future__ import annotations

import pytest

import rankscope as rs
from rankscope.core import names as attr

from ..conftest import free_port, run_python
from ..otlp_receiver import GrpcReceiver, HttpReceiver


def _record_two_steps() -> None:
    for step in range(2):
        rs.record_metric("loss", 1.0 + step)
        rs.record_metric("loss", 3.0 + step)
        rs.record_metric("tokens", 10, rs.Reduce.SUM)
        rs.flush(step)


def _check(points: list) -> None:
    mine = [p for p in points if p.key == "loss"]
    assert sorted((p.step, p.state["sum"], p.state["count"]) for p in mine) == [(0, 4.0, 2), (1, 6.0, 2)]
    assert {p.reduce for p in mine} == {"mean"}
    tokens = [p for p in points if p.key == "tokens"]
    assert [(p.step, p.reduce, p.state["sum"]) for p in sorted(tokens, key=lambda p: p.step)] == [
        (0, "sum", 10.0),
        (1, "sum", 10.0),
    ]
    resource = mine[0].resource
    assert resource[attr.EXPERIMENT_ID] == "exp-otlp" and resource[attr.ROLE] == "trainer"
    assert resource[attr.RANK] == "0" and resource[attr.WORLD_SIZE] == "1"
    assert resource[attr.EXPERIMENT_ATTEMPT] == 0 and resource[attr.SERVICE_NAME] == "trainer"


def test_grpc_export_carries_step_reduce_and_resource(receiver: GrpcReceiver) -> None:
    rs.init(experiment="exp-otlp", role="trainer", endpoint=receiver.endpoint)
    _record_two_steps()
    assert rs.force_flush(20)
    _check(receiver.wait_for(lambda ps: sum(p.key == "loss" for p in ps) == 2))


def test_http_protobuf_export(http_receiver: HttpReceiver) -> None:
    rs.init(experiment="exp-otlp", role="trainer", endpoint=http_receiver.endpoint, protocol="http/protobuf")
    _record_two_steps()
    assert rs.force_flush(20)
    _check(http_receiver.wait_for(lambda ps: sum(p.key == "loss" for p in ps) == 2))


def test_standard_otel_variables_are_honoured(receiver: GrpcReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{receiver.endpoint}")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "rankscope.experiment.id=exp-otlp,team=rl")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer")
    _record_two_steps()  # auto-init from the environment
    assert rs.force_flush(20)
    points = receiver.wait_for(lambda ps: sum(p.key == "loss" for p in ps) == 2)
    _check(points)
    assert points[0].resource["team"] == "rl"


def _marker_steps(receiver: GrpcReceiver) -> list[int]:
    return sorted(
        dp.attributes[0].value.int_value
        for r in list(receiver.requests)
        for rm in r.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == attr.FLUSH_MARKER
        for dp in m.sum.data_points
    )


def test_each_flush_sends_a_step_marker(receiver: GrpcReceiver) -> None:
    rs.init(endpoint=receiver.endpoint)
    rs.flush(0)  # nothing recorded: the sink still learns this process closed step 0
    rs.record_metric("a", 1.0)
    rs.flush(1)
    assert rs.force_flush(20)
    receiver.wait_for(lambda _: _marker_steps(receiver) == [0, 1], timeout=10)


def test_periodic_export_for_a_process_that_never_flushes(receiver: GrpcReceiver) -> None:
    rs.init(endpoint=receiver.endpoint, export_interval=0.2)
    rs.record_metric("queue_depth", 5.0, rs.Reduce.MAX)
    points = receiver.wait_for(lambda ps: any(p.key == "queue_depth" for p in ps), timeout=10)
    depth = [p for p in points if p.key == "queue_depth"]
    assert depth[0].step is None and depth[0].state["max"] == 5.0


@pytest.mark.timeout(20)  # the bound: RANKSCOPE_SHUTDOWN_TIMEOUT is 1 s here
def test_dead_endpoint_never_blocks_and_counts_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKSCOPE_SHUTDOWN_TIMEOUT", "1")
    monkeypatch.setenv("RANKSCOPE_MAX_QUEUED_STEPS", "4")
    rs.init(endpoint=f"127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.warns(RuntimeWarning, match="dropp") as said:
        for step in range(20):
            for k in range(200):
                rs.record_metric(f"k{k}", float(step))
            rs.flush(step)
        rs.shutdown()
    # Bounded by RANKSCOPE_SHUTDOWN_TIMEOUT, not by retries: shutdown gave up on its deadline and said so.
    assert any("within RANKSCOPE_SHUTDOWN_TIMEOUT" in str(w.message) for w in said), [str(w.message) for w in said]
    from rankscope.core import errors

    assert errors.internal_errors == []


def test_disable_makes_nothing_leave_the_process(receiver: GrpcReceiver) -> None:
    code = (
        "import rankscope as rs, time\n"
        "rs.init(backends={'console': {'logging_mode': 'per_rank_no_reduce'}})\n"
        "for i in range(100): rs.record_metric('x', float(i))\n"
        "rs.flush(0); rs.force_flush(5); rs.shutdown()\n"
        "print('resource', rs.get_resource())\n"
    )
    env = {"RANKSCOPE_DISABLE": "yes", "RANKSCOPE_ENDPOINT": receiver.endpoint, "RANKSCOPE_EXPORT_INTERVAL": "0.1"}
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "resource None"  # no stream lines, no identity
    # Control: the same code without RANKSCOPE_DISABLE does send (so the receiver would see it).
    control = run_python(code, {**env, "RANKSCOPE_DISABLE": "0"})
    assert control.returncode == 0, control.stderr
    receiver.wait_for(lambda ps: any(p.key == "x" for p in ps))
    assert {p.resource[attr.PROCESS_PID] for p in receiver.points()} == {
        p.resource[attr.PROCESS_PID] for p in receiver.points() if p.key == "x"
    }
    assert len({p.resource[attr.SERVICE_INSTANCE_ID] for p in receiver.points()}) == 1  # only the control run


def test_a_dead_endpoint_costs_the_exit_at_most_the_shutdown_timeout_and_one_warning() -> None:
    """A wrong or dead endpoint: shutdown gives up after RANKSCOPE_SHUTDOWN_TIMEOUT (default 2 s)
    and says so once, with the count; the endpoint's trouble is logged once when it starts."""
    code = """
import rankscope as rs
for step in range(3):
    rs.record_metric("x", 1.0)
    rs.flush(step)
rs.shutdown()
"""
    env = {"RANKSCOPE_ENDPOINT": f"127.0.0.1:{free_port()}", "RANKSCOPE_EXPERIMENT": "dead"}
    done = run_python(code, env, timeout=20)  # the bound: a fresh interpreter, torch's import and the 2 s
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = [line for line in done.stderr.splitlines() if "Warning:" in line]
    assert len(warnings) == 1 and "3 metric points were dropped at shutdown" in warnings[0], done.stderr
    assert "within RANKSCOPE_SHUTDOWN_TIMEOUT" in warnings[0], done.stderr  # it gave up on the deadline
    assert done.stderr.count("does not take exports (") == 1, done.stderr


def _markers(receiver: GrpcReceiver) -> list[tuple[int, int, int]]:
    """Each flush marker received: its step, its time (the flush) and its request's arrival (ns)."""
    return [
        (dp.attributes[0].value.int_value, dp.time_unix_nano, arrived)
        for request, arrived in zip(list(receiver.requests), list(receiver.arrived), strict=True)
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == attr.FLUSH_MARKER
        for dp in m.sum.data_points
    ]


def _marker_latencies(receiver: GrpcReceiver) -> dict[int, float]:
    """Seconds from each step's flush (its marker's time) to the arrival of the request that carried it."""
    return {step: (arrived - flushed) / 1e9 for step, flushed, arrived in _markers(receiver)}


@pytest.mark.timeout(90)
def test_fast_steps_share_requests_a_few_a_second_and_each_arrives_within_a_second(
    receiver: GrpcReceiver,
) -> None:
    import time

    rs.init(experiment="cadence", endpoint=receiver.endpoint)
    started = time.monotonic()
    for step in range(200):  # ~100 steps a second
        for i in range(20):
            rs.record_metric(f"k{i}", float(step))
        rs.flush(step)
        time.sleep(0.01)
    seconds = time.monotonic() - started
    requests_during = len(receiver.requests)
    assert rs.force_flush(20)
    latencies = _marker_latencies(receiver)
    assert sorted(latencies) == list(range(200))
    slowest = sorted(latencies.values())
    assert slowest[int(0.99 * len(slowest))] <= 1.0, slowest[-5:]  # p99 within 1 s of the flush
    assert requests_during <= 4 * seconds + 2, (requests_during, seconds)  # 200 steps, a handful of requests


@pytest.mark.timeout(60)
def test_steps_flushed_during_a_slow_round_leave_when_it_ends() -> None:
    """The gap between rounds counts from a round's start: the steps flushed while one waited 1.5 s
    for its answer go as soon as it ends. From its end, they waited another 0.6 s, and a stall of the
    box made three slow steps in a row arrive 0.5-0.9 s after their flush."""
    import time

    receiver = GrpcReceiver(first_answer_delay=1.5)
    try:
        rs.init(experiment="cadence", endpoint=receiver.endpoint, export_interval=30.0)
        for step in range(3):  # step 0's answer comes 1.5 s late: steps 1 and 2 are flushed meanwhile
            rs.record_metric("loss", 1.0)
            rs.flush(step)
            time.sleep(0.6)
        receiver.wait_for(lambda _: len(_marker_latencies(receiver)) == 3, timeout=20)
        assert receiver.answered_late is not None
        arrived = {step: when for step, _, when in _markers(receiver)}
        after_the_slow_round = [(arrived[step] - receiver.answered_late) / 1e9 for step in (1, 2)]
        assert max(after_the_slow_round) < 0.3, after_the_slow_round  # not a gap (0.6 s) after it
    finally:
        rs.shutdown()
        receiver.close()


def test_a_slow_step_leaves_at_its_flush(receiver: GrpcReceiver) -> None:
    """Each step wakes the idle export thread: it leaves at its flush, not at the 30 s export interval.
    Judged on the median: one stall of the process (a busy fresh clone's read 0.87 s in the suite) may
    delay a step and the next one or two (a round starts at most once a gap), not most of them."""
    import time

    rs.init(experiment="cadence", endpoint=receiver.endpoint, export_interval=30.0)
    for step in range(6):
        time.sleep(0.7)  # slower than the cadence (a round of metrics and spans: 0.6 s): idle at the flush
        rs.record_metric("loss", 1.0)
        rs.flush(step)
    receiver.wait_for(lambda _: len(_marker_latencies(receiver)) == 6, timeout=20)
    latencies = sorted(_marker_latencies(receiver).values())
    assert latencies[-1] < 5.0, latencies  # woken by the flush: none waited for the export interval
    assert (latencies[2] + latencies[3]) / 2 < 0.3, latencies  # the median: at its flush, not a round gap late
