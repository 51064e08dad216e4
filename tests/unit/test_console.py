"""The console view (issue 41, items 3, 4 and 8): a compact line per step for people, Forge's blocks
on request, and what a process with nothing configured shows and says."""

from __future__ import annotations

import re

import pytest

import rankscope as rs
from rankscope.backends.console import ConsoleBackend, short_value
from rankscope.metrics.reduce import Reduce

M = rs.Metric


def straggler(step: int, who: str = "trainer_r2", phase: str = "train/forward") -> dict[str, object]:
    return {"type": "straggler", "step": step, "process": who, "phase": phase, "ratio": 324.5123}


def global_step(step: int, loss: float) -> list[rs.Metric]:
    """A sink's global view of a step: the user's keys among rankscope's own, in a shuffled order."""
    metrics = [
        M("straggler/train/forward/slowest_rank", 2.0, Reduce.MAX),
        M("train/total_duration_max_s", 0.4123456, Reduce.MAX),
        M("train/total_duration_max_s/argmax_rank", 2.0, Reduce.MAX),
        M("rl/lineage_links_dropped", 0.0, Reduce.SUM),
        M("trainer/loss", loss, Reduce.MEAN),
        M("trainer/grad_norm", 2.3776090145, Reduce.MAX),
        M("trainer/grad_norm/argmax_rank", 0.0, Reduce.MAX),
        M("train/forward/duration_avg_s", 0.0017, Reduce.MEAN),
        M("rankscope/missing_processes", 0.0, Reduce.MAX),
        M("optimizer/step_s", 0.01, Reduce.MEAN),
        M("generator/reward", 0.40691615, Reduce.MEAN),
        M("tokens/p50", 39.0984997, Reduce.DISTRIBUTION),
        M("tokens/p90", 181.99958, Reduce.DISTRIBUTION),
        M("tokens/p99", 181.99958, Reduce.DISTRIBUTION),
        M("tokens/mean", 92.875, Reduce.DISTRIBUTION),
        M("trainer/samples", 1024.0, Reduce.SUM),
    ]
    return metrics[step % 3 :] + metrics[: step % 3]  # the order a sink merges in changes between steps


def sink_view(backend: ConsoleBackend, step: int, loss: float = 0.18709983490407467) -> None:
    labels = {"trainer/grad_norm/argmax_rank": "trainer_r0", "train/total_duration_max_s/argmax_rank": "trainer_r2"}
    backend.log_batch(global_step(step, loss), step, labels=labels, missing=[], phase_times={})


def test_compact_is_one_line_per_step_users_keys_in_a_stable_order_four_digits(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    backend.init("global")
    for step in range(3):
        sink_view(backend, step)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines  # one line per step
    expected = (
        "step {}  generator/reward 0.4069  tokens 92.88 (p50 39.1 p90 182 p99 182)  trainer/grad_norm 2.378 "
        "(trainer_r0)  trainer/loss 0.1871  trainer/samples 1024  | time 412.3ms, slowest trainer_r2"
    )
    assert lines == [expected.format(step) for step in range(3)]
    for internal in ("straggler/", "rl/", "rankscope/", "optimizer/", "duration", "argmax_rank"):
        assert internal not in "\n".join(lines)


def test_a_key_keeps_its_place_and_new_keys_go_last() -> None:
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    backend.init("global")
    orders = []
    for keys in (["b", "a"], ["zz", "a", "b"], ["c", "b"]):
        lines = backend._compact("", [M(k, 1.0, Reduce.MEAN) for k in keys], 0, {}, {})
        orders.append(re.findall(r"  (\w+) 1", lines[0]))
    assert orders == [["a", "b"], ["a", "b", "zz"], ["b", "c"]]


def test_a_long_step_wraps_to_the_terminals_width_under_its_first_key(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    lines = backend._compact("", [M(f"key_{i:02d}", i + 0.123456, Reduce.MEAN) for i in range(20)], 7, {}, {})
    assert 1 < len(lines) <= 5 and all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("step 7  key_00 0.1235") and all(line.startswith(" " * 7) for line in lines[1:])


def test_short_values_are_four_significant_digits() -> None:
    cases = {0.18709983490407467: "0.1871", 2.3776090145: "2.378", 1024.0: "1024", 12345678.9: "1.235e+07"}
    cases |= {-0.000123456: "-0.0001235", 3.0: "3", float("nan"): "nan", float("-inf"): "-inf"}
    assert {short_value(v): want for v, want in cases.items()} == {want: want for want in cases.values()}


def test_a_straggler_streak_is_one_highlighted_line(capsys) -> None:
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    backend.init("global")
    for step in range(8):
        if step >= 3:  # trainer_r2 is the straggler from step 3 to the end
            backend.log_anomaly(straggler(step), step)
        if step == 5:  # another one, once
            backend.log_anomaly(straggler(step, "trainer_r0", "train/data"), step)
        sink_view(backend, step)
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("!!!")] == [
        "!!! step 3 straggler: trainer_r2 in train/forward (324.5x the median)",
        "!!! step 5 straggler: trainer_r0 in train/data (324.5x the median)",
    ]
    backend.log_anomaly(straggler(10), 10)  # the streak ended at 7: a new one
    assert capsys.readouterr().out == "!!! step 10 straggler: trainer_r2 in train/forward (324.5x the median)\n"


def test_a_lone_views_nan_is_said_once_per_streak_and_a_sinks_detector_is_not_repeated(capsys) -> None:
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    backend.init("main_r0")
    for step, loss in enumerate([1.0, float("nan"), float("nan"), 0.5, float("inf")]):
        backend.log_batch([M("loss", loss, Reduce.MEAN)], step, step_seconds=0.25)
    assert capsys.readouterr().out.splitlines() == [
        "step 0  loss 1  | time 250ms",
        "step 1  loss nan  | time 250ms",
        "!!! step 1 non-finite value: loss (nan)",
        "step 2  loss nan  | time 250ms",
        "step 3  loss 0.5  | time 250ms",
        "step 4  loss inf  | time 250ms",
        "!!! step 4 non-finite value: loss (inf)",
    ]
    record = {"type": "nonfinite", "step": 5, "key": "loss", "process": "trainer_r1", "count": 1}
    backend.log_anomaly(record, 5)  # a sink's detector named it: the view does not again
    backend.log_batch([M("loss", float("nan"), Reduce.MEAN)], 5)
    assert capsys.readouterr().out.splitlines() == [
        "!!! step 5 non-finite value: loss from trainer_r1 (1 in the step)",
        "step 5  loss nan",
    ]


def test_an_interrupted_step_is_said_with_no_time(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    backend.log_anomaly({"type": "interrupted", "step": 9, "processes": ["trainer_r1"], "count": 1}, 9)
    sink_view(backend, 9)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "!!! step 9 interrupted: the job ended before every process closed it (trainer_r1 had not)"
    assert len(lines) == 2 and "trainer/loss 0.1871" in lines[1] and "| time" not in lines[1]


def test_full_is_forges_block_and_the_format_comes_from_the_option_or_the_variable(capsys, monkeypatch) -> None:
    backend = ConsoleBackend({"logging_mode": "global_reduce", "format": "full"})
    backend.log_batch([M("my_sum_metric", 6.0, Reduce.SUM), M("loss", 0.1 + 0.2, Reduce.MEAN)], 0)
    block = "=== [GlobalReduce] - METRICS STEP 0 ===\nmy_sum_metric: 6.0\nloss: 0.30000000000000004\n===============\n"
    assert capsys.readouterr().out == block
    monkeypatch.setenv("RANKSCOPE_CONSOLE", "full")
    assert ConsoleBackend({}).format == "full"
    assert ConsoleBackend({"format": "compact"}).format == "compact"  # the option wins
    monkeypatch.setenv("RANKSCOPE_CONSOLE", "off")
    silent = ConsoleBackend({"logging_mode": "global_reduce"})
    silent.log_batch([M("loss", 1.0, Reduce.MEAN)], 0)
    silent.log_anomaly(straggler(0), 0)
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="format 'verbose' is not one of compact, full, off"):
        ConsoleBackend({"format": "verbose"})


def test_with_nothing_configured_a_lone_process_prints_a_line_per_step_and_says_where(capsys) -> None:
    rs.init(experiment="alone")
    for step in range(3):
        rs.record_metric("loss", 1.0 / (step + 1))
        rs.flush(step)
    rs.shutdown()
    out, err = capsys.readouterr()
    assert re.findall(r"^step (\d)  loss (\S+)  \| time \S+$", out, re.M) == [("0", "1"), ("1", "0.5"), ("2", "0.3333")]
    assert err.count("rankscope: experiment alone run ") == 1 and "metrics -> this console" in err


def test_a_console_set_off_or_an_empty_backends_variable_prints_nothing(capsys, monkeypatch) -> None:
    for name, value in (("RANKSCOPE_CONSOLE", "off"), ("RANKSCOPE_BACKENDS", "{}")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            rs.init(experiment="quiet")
            rs.record_metric("loss", 1.0)
            rs.flush(0)
            rs.shutdown()
        assert capsys.readouterr().out == "", name


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("localhost:43l7", "its port is not a number from 1 to 65535"),
        ("htp://localhost:4317", "'htp':// is not a scheme rankscope exports to"),
        ("localhost", "it names no port"),
    ],
)
def test_a_mistyped_endpoint_is_refused_at_init_naming_the_variable(monkeypatch, value: str, why: str) -> None:
    monkeypatch.setenv("RANKSCOPE_ENDPOINT", value)
    with pytest.raises(ValueError, match=re.escape(f"RANKSCOPE_ENDPOINT={value!r}: must be host:port")) as raised:
        rs.init(experiment="typo")
    assert why in str(raised.value)
    with pytest.raises(ValueError, match=re.escape(f"endpoint={value!r}")):
        rs.init(experiment="typo", endpoint=value)
