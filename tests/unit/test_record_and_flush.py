"""record_metric, flush and the local backends in one process."""

from __future__ import annotations

import json
import math
from typing import ClassVar

import numpy as np
import pytest
import torch

import rankscope as rs


def test_forge_single_process_example_prints_global_block(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(backends={"console": {"logging_mode": "global_reduce", "format": "full"}})
    for number in range(1, 4):
        rs.record_metric("my_sum_metric", number, rs.Reduce.SUM)
        rs.record_metric("my_max_metric", number, rs.Reduce.MAX)
        rs.record_metric("my_mean_metric", number, rs.Reduce.MEAN)
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert (
        "=== [GlobalReduce] - METRICS STEP 0 ===\nmy_sum_metric: 6.0\nmy_max_metric: 3.0\nmy_mean_metric: 2.0\n" in out
    )


def test_per_rank_reduce_header_names_the_process(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(role="generator", replica=1, backends={"console": {"logging_mode": "per_rank_reduce", "format": "full"}})
    rs.record_metric("tokens", 5, rs.Reduce.SUM)
    rs.flush(3)
    rs.record_metric("tokens", 7, rs.Reduce.SUM)
    rs.flush(4)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "=== [generator_1_r0] - METRICS STEP 3 ===\ntokens: 5.0\n" in out
    assert "=== [generator_1_r0] - METRICS STEP 4 ===\ntokens: 7.0\n" in out


def test_values_of_every_accepted_type_and_nan_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(backends={"console": {"logging_mode": "global_reduce", "format": "full"}})
    for value in (1, 2.0, True, np.float32(3.0), np.int64(4), np.array([5.0]), torch.tensor(6.0), torch.tensor([7])):
        rs.record_metric("mixed", value, rs.Reduce.SUM)
    rs.record_metric("broken", math.nan, rs.Reduce.MEAN)
    rs.record_metric("broken", 1.0, rs.Reduce.MEAN)
    rs.record_metric("blowup", math.inf, rs.Reduce.MAX)
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "mixed: 29.0" in out and "broken: nan" in out and "blowup: inf" in out


@pytest.mark.parametrize(
    ("key", "value", "error", "match"),
    [
        ("loss", "0.5", TypeError, "'loss'.*str"),
        ("loss", None, TypeError, "'loss'"),
        ("loss", torch.ones(3), ValueError, "'loss'.*shape \\(3,\\)"),
        ("loss", np.ones(2), ValueError, "'loss'"),
        ("loss", torch.tensor(1 + 2j), TypeError, "'loss'.*dtype"),
        ("", 1.0, ValueError, "empty"),
        ("9lives", 1.0, ValueError, "'9lives'"),
        ("has space", 1.0, ValueError, "'has space'"),
    ],
)
def test_bad_input_raises_at_the_call_site(key: str, value: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        rs.record_metric(key, value)


def test_a_reduce_given_by_name_says_the_reduce_it_was_meant_to_be() -> None:
    with pytest.raises(TypeError, match=r"'grad_norm'.*\(rankscope\.Reduce\.MAX\), got 'max'"):
        rs.record_metric("grad_norm", 1.0, "max")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"reduce must be a rankscope Reduce, got 'maximum'"):
        rs.record_metric("grad_norm", 1.0, "maximum")  # type: ignore[arg-type]


def test_two_reduce_types_for_one_key_raise_at_second_call() -> None:
    rs.record_metric("reward", 1.0, rs.Reduce.MEAN)
    rs.flush(0)
    with pytest.raises(ValueError, match=r"'reward'.*Reduce\.MEAN.*Reduce\.MAX"):
        rs.record_metric("reward", 1.0, rs.Reduce.MAX)
    with pytest.raises(ValueError, match="case-insensitive"):
        rs.record_metric("Reward", 1.0, rs.Reduce.MEAN)


def test_bad_input_loses_nothing_already_recorded(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(backends={"console": {"logging_mode": "global_reduce", "format": "full"}})
    rs.record_metric("loss", 1.0)
    with pytest.raises(TypeError):
        rs.record_metric("loss", "oops")
    rs.record_metric("loss", 3.0)
    rs.flush(0)
    rs.shutdown()
    assert "loss: 2.0" in capsys.readouterr().out


def test_per_rank_no_reduce_streams_every_value(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(role="trainer", backends={"console": {"logging_mode": "per_rank_no_reduce", "format": "full"}})
    for i in range(8):
        rs.record_metric("my_sum_rank_metric", i % 2, rs.Reduce.SUM)
    rs.flush(0)
    rs.shutdown()
    lines = [line for line in capsys.readouterr().out.splitlines() if "my_sum_rank_metric" in line]
    assert len(lines) == 8
    assert all(line.startswith("[0] [trainer-0/1] ") and " INFO my_sum_rank_metric: " in line for line in lines)
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["0.0", "1.0"] * 4


def test_jsonl_backend_writes_both_modes(tmp_path) -> None:
    reduced, stream = tmp_path / "reduced.jsonl", tmp_path / "stream.jsonl"
    rs.init(
        experiment="exp-j",
        backends={
            "jsonl": {"logging_mode": "per_rank_reduce", "path": str(reduced)},
        },
    )
    rs.shutdown()
    from rankscope.backends.jsonl import JsonlBackend

    rs.register_backend("jsonl_stream", JsonlBackend)
    rs.init(
        experiment="exp-j",
        backends={
            "jsonl": {"logging_mode": "per_rank_reduce", "path": str(reduced)},
            "jsonl_stream": {"logging_mode": "per_rank_no_reduce", "path": str(stream)},
        },
    )
    rs.record_metric("lat", 1.0, rs.Reduce.DISTRIBUTION)
    rs.record_metric("lat", 3.0, rs.Reduce.DISTRIBUTION)
    rs.record_metric("nanny", math.nan)
    rs.flush(7)
    rs.shutdown()
    rows = [json.loads(line) for line in reduced.read_text().splitlines()]
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) == {"lat/p50", "lat/p90", "lat/p99", "lat/mean", "nanny"}
    assert by_key["lat/mean"]["value"] == 2.0 and by_key["lat/mean"]["step"] == 7
    assert math.isnan(by_key["nanny"]["value"]) and by_key["nanny"]["experiment"] == "exp-j"
    streamed = [json.loads(line) for line in stream.read_text().splitlines()]
    assert [(r["key"], r["value"], r["kind"]) for r in streamed][:2] == [("lat", 1.0, "stream"), ("lat", 3.0, "stream")]


def test_unknown_backend_and_mode_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'wandbx'.*console"):
        rs.init(backends={"wandbx": {}})
    with pytest.raises(ValueError, match="logging_mode 'global'"):
        rs.init(backends={"console": {"logging_mode": "global"}})


def test_flush_rejects_a_non_int_step() -> None:
    with pytest.raises(TypeError, match="step"):
        rs.flush("3")  # type: ignore[arg-type]


def test_compiled_code_skips_recording_without_graph_break(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(backends={"console": {"logging_mode": "global_reduce", "format": "full"}})

    @torch.compile(backend="eager", fullgraph=True)
    def step(x: torch.Tensor) -> torch.Tensor:
        y = (x * 2).sum()
        rs.record_metric("inside_compile", y)
        return y

    assert step(torch.ones(4)).item() == 8.0  # fullgraph=True: a graph break would raise
    rs.record_metric("outside_compile", 1.0)
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "outside_compile: 1.0" in out and "inside_compile" not in out


def test_reinit_keeps_values_recorded_before(capsys: pytest.CaptureFixture[str]) -> None:
    rs.record_metric("early", 4.0)  # auto-init, no backends
    rs.init(backends={"console": {"logging_mode": "global_reduce", "format": "full"}})
    rs.flush(0)
    rs.shutdown()
    assert "early: 4.0" in capsys.readouterr().out


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


def test_every_step_holds_only_its_own_values_while_the_export_thread_recycles_accumulators(tmp_path) -> None:
    """Accumulators go round (step in progress -> exported -> reset, in the next step's accumulators
    or its spares -> the key's first value): 20 steps of five reduce types, some keys skipped some
    steps (a MEAN one among them: its reset accumulator is not exported), each step exact."""
    import time

    from rankscope.core import runtime

    path = tmp_path / "v.jsonl"
    rs.init(backends={"jsonl": {"logging_mode": "global_reduce", "path": str(path)}})
    recorder = runtime.get().recorder  # type: ignore[union-attr]
    reused = 0
    for step in range(20):
        deadline = time.monotonic() + 5
        while step and not ("mean" in recorder.accs or recorder.spares_waiting) and time.monotonic() < deadline:
            time.sleep(0.001)  # the export thread has not recycled the last step yet
        spares = {id(a) for d in (recorder.accs, recorder.spare, *recorder.spares_waiting) for a in d.values()}
        for i in range(3):
            rs.record_metric("mean", step + i)
            rs.record_metric("max", step * 10 + i, rs.Reduce.MAX)
            rs.record_metric("sum", 1, rs.Reduce.SUM)
            if step % 3 == 0:
                rs.record_metric("sometimes", step, rs.Reduce.MIN)
                rs.record_metric("sometimes_mean", step)  # waits, empty, in the next step's accumulators
        rs.record_metric("last", step, rs.Reduce.LAST)
        reused += sum(id(a) in spares for a in recorder.accs.values())
        rs.flush(step)
    rs.shutdown()
    assert reused >= 19 * 4  # from step 1 on, every key recorded the step before took its spare
    rows: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "key" in row and "step" in row:
            rows.setdefault(row["step"], {})[row["key"]] = row["value"]
    assert sorted(rows) == list(range(20))
    for step, values in rows.items():
        expected = {"mean": step + 1.0, "max": step * 10 + 2.0, "sum": 3.0, "last": float(step)}
        if step % 3 == 0:
            expected["sometimes"] = expected["sometimes_mean"] = float(step)
        assert {k: v for k, v in values.items() if not k.startswith("rankscope/")} == expected, step


def _wait_for_spares(recorder: object) -> None:
    """Until the export thread has recycled a step (the next take starts with its accumulators)."""
    import time

    deadline = time.monotonic() + 10
    while not recorder.spares_waiting and time.monotonic() < deadline:  # type: ignore[attr-defined]
        assert rs.force_flush(10)
        time.sleep(0.01)
    assert recorder.spares_waiting, "the export thread recycled no step in 10 s"  # type: ignore[attr-defined]


def _step_lines(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines() if line.startswith("step ")]


def test_shutdown_after_automatic_steps_makes_no_step_of_the_recycled_accumulators_alone(capsys) -> None:
    """An instrumented loop's steps close themselves; at shutdown, what was recorded after the last
    one becomes one more step. Reset accumulators waiting in the step (recycled, no value) are not
    something recorded: no empty step 4 is made of them."""
    from rankscope.core import runtime
    from rankscope.lifecycle import driving

    rs.init(backends={"console": {"logging_mode": "global_reduce"}})
    state = runtime.get()
    assert state is not None
    state.steps.auto = True  # as a process that never called init has it (the instrumentors close its steps)
    recorder = state.recorder
    for step in range(4):
        driving.settle_auto_step()  # what an instrumentor calls before recording
        rs.record_metric("loss", float(step))
        driving.auto_step()  # an instrumented optimizer step ended
        if step:  # step - 1 was closed above: its accumulators come back
            _wait_for_spares(recorder)
    rs.shutdown()
    assert state.steps.last == 3
    assert _step_lines(capsys.readouterr().out) == ["0", "1", "2", "3"]


def test_shutdown_with_nothing_recorded_after_the_last_flush_sends_that_step_once(capsys) -> None:
    """Values recorded after the last flush that are all rankscope's own go with that step; reset
    accumulators of rankscope's own keys waiting in the step are not values: step 2 is sent once."""
    from rankscope.core import runtime

    rs.init(backends={"console": {"logging_mode": "global_reduce"}})
    recorder = runtime.get().recorder  # type: ignore[union-attr]
    for step in range(3):
        rs.record_metric("comm/barrier/time_s", 0.5)
        if step:  # the last step's accumulators come back before this flush: the next step starts with them
            _wait_for_spares(recorder)
        rs.flush(step)
    assert list(recorder.accs) == ["comm/barrier/time_s"] and not recorder.recorded()
    rs.shutdown()
    assert _step_lines(capsys.readouterr().out) == ["0", "1", "2"]
