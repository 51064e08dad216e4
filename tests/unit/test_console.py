"""The console view (issue 41, items 3, 4 and 8): a compact line per step for people, Forge's blocks
on request, and what a process with nothing configured shows and says."""

from __future__ import annotations

import os
import pty
import re
from typing import Any

import pytest

import rankscope as rs
from rankscope.backends.console import ERASE_LINE, ConsoleBackend, fresh_line, short_value
from rankscope.core.anomalies import Corrected, Interrupted, NonFinite, Straggler
from rankscope.metrics.reduce import Reduce
from rankscope.sink.testing import Process

M = rs.Metric


def straggler(
    first: int, who: str = "trainer_r2", phase: str = "train/forward", named: int = 1, **more: object
) -> Straggler:
    """A sink's straggler record: one per streak, as when the sink named it (``named`` steps after it began)."""
    record: dict[str, Any] = {"step": first, "first_step": first, "last_step": first + named}
    record |= {"steps": named + 1, "process": who}
    record |= {"role": who.rsplit("_r", 1)[0], "replica": None, "rank": int(who.rsplit("_r", 1)[1]), "phase": phase}
    record |= {"collective": None, "ratio": 352.5876, "excess_s": 0.15012345, "late_s": None, "waited_s_max": None}
    return Straggler(**{**record, "waiting": 0, **more})


def global_step(step: int, loss: float) -> list[rs.Metric]:
    """A sink's global view of a step: the user's keys among rankscope's own, in a shuffled order."""
    metrics = [
        M("straggler/train/forward/over_others", 352.6, Reduce.MAX),
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
        "step {}  trainer/loss 0.1871  trainer/grad_norm 2.378 (trainer_r0)  generator/reward 0.4069  "
        "tokens 92.88 (p50 39.1 p90 182 p99 182)  trainer/samples 1024  | time 412.3ms, slowest trainer_r2"
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
    assert orders == [["b", "a"], ["b", "a", "zz"], ["b", "c"]]  # the order they came in


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


def test_a_straggler_streak_is_one_highlighted_line_naming_the_cause_and_its_victims(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line each here (wrapped at a terminal's width)
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    backend.init("global")
    late = {"collective": "all_reduce", "late_s": 0.1498, "waited_s_max": 0.15, "waiting": 3}
    for step in range(8):
        if step == 4:  # trainer_r2 is the straggler from step 3 to the end: named at its 2nd step, once
            backend.log_anomaly(straggler(3, **late), step)
        if step == 5:  # another one, in no collective, named at once
            backend.log_anomaly(straggler(step, "trainer_r0", "train/data", named=0), step)
        if step == 6:  # the first streak's record again, as it went on (its time now in backward): not news
            backend.log_anomaly(straggler(3, phase="train/backward", named=3, **late), step)
        sink_view(backend, step)
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("!!!")] == [
        "!!! step 4 straggler: trainer_r2 in train/forward since step 3, +150.1ms (352.6x the others); "
        "arrived last at all_reduce, 3 others waited up to 150ms",
        "!!! step 5 straggler: trainer_r0 in train/data, +150.1ms (352.6x the others)",
    ]
    backend.log_anomaly(straggler(9, waited_s_max=0.002, waiting=1), 10)  # a new streak
    assert capsys.readouterr().out == (
        "!!! step 10 straggler: trainer_r2 in train/forward since step 9, +150.1ms (352.6x the others); "
        "1 other waited up to 2ms\n"
    )
    late_only = {"collective": "broadcast", "excess_s": 0.02, "ratio": 3.0, "waited_s_max": 0.04, "waiting": 1}
    backend.log_anomaly(straggler(10, "trainer_r1", "", named=0, **late_only), 10)  # late to a collective only
    assert capsys.readouterr().out == (
        "!!! step 10 straggler: trainer_r1, +20ms (3x the others); arrived last at broadcast, "
        "1 other waited up to 40ms\n"
    )
    for step in (11, 12):  # a streak's record said again (a copy as it went on): once per streak
        backend.log_anomaly(
            Straggler(step=11, first_step=11, last_step=step, process="trainer_r3", phase="x", ratio=2, excess_s=0.02),
            step,
        )
    assert capsys.readouterr().out == "!!! step 11 straggler: trainer_r3 in x, +20ms (2x the others)\n"


def test_the_step_names_who_held_it_up_net_of_waits_from_the_sinks_straggler_keys(capsys, monkeypatch) -> None:
    """trainer_r0 spent 150 ms waiting in backward's all-reduce for trainer_r1, slow in forward:
    the step's time names trainer_r1 in forward, from ``straggler/{phase}/late_*``, not the waiter."""
    monkeypatch.setenv("COLUMNS", "400")
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    r0, r1 = (
        Process("t-0", "trainer_r0", "trainer", None, 0, 2, 0, "h", 1, {}),
        Process("t-1", "trainer_r1", "trainer", None, 1, 2, 0, "h", 2, {}),
    )
    phase_times = {"train/forward": {r0: 0.001, r1: 0.151}, "train/backward": {r0: 0.1562, r1: 0.005}}
    keys = {"train/forward": (1.0, 0.15), "train/backward": (0.0, 0.001)}
    metrics = [M("loss", 1.0, Reduce.MEAN), M("train/total_duration_max_s", 0.16, Reduce.MAX)]
    for phase, (rank, late_s) in keys.items():
        metrics += [
            M(f"straggler/{phase}/late_rank", rank, Reduce.MAX),
            M(f"straggler/{phase}/late_s", late_s, Reduce.MAX),
        ]
    metrics.append(M("straggler/comm/all_reduce/late_s", 0.5, Reduce.MAX))  # an arrival gap, not a phase
    backend.log_batch(metrics, 4, phase_times=phase_times)
    backend.log_batch(metrics[:2], 5, phase_times=phase_times)  # no straggler keys: the others' mean
    assert capsys.readouterr().out.splitlines() == [
        "step 4  loss 1  | time 160ms, slowest trainer_r1 in train/forward +150ms",
        "step 5  loss 1  | time 160ms, slowest trainer_r0 in train/backward +151.2ms",
    ]


def test_a_step_without_phases_names_the_last_to_arrive_never_the_rank_that_waited_longest(capsys, monkeypatch) -> None:
    """examples/spmd_torchrun.py traces no phase: its step held only all-reduces, where trainer_r0
    waited 19.66 ms for trainer_r2. The line had said ``slowest trainer_r0 in comm/all_reduce``
    (the longest time in the collective: a wait); it names the rank that arrived last."""
    monkeypatch.setenv("COLUMNS", "400")
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    r0, r2 = (
        Process("t-0", "trainer_r0", "trainer", None, 0, 4, 0, "h", 1, {}),
        Process("t-2", "trainer_r2", "trainer", None, 2, 4, 0, "h", 2, {}),
    )
    phase_times = {"comm/all_reduce": {r0: 0.0201, r2: 0.0004}}
    metrics = [
        M("loss", 1.0, Reduce.MEAN),
        M("straggler/comm/all_reduce/late_rank", 2.0, Reduce.MAX),
        M("straggler/comm/all_reduce/late_s", 0.0131, Reduce.MAX),
        M("straggler/comm/all_reduce/waited_s_max", 0.0197, Reduce.MAX),
    ]
    labels = {"straggler/comm/all_reduce/late_rank": "trainer_r2"}
    backend.log_batch(metrics, 3, phase_times=phase_times, step_seconds=0.03, labels=labels)
    backend.log_batch(metrics[:1], 4, phase_times=phase_times, step_seconds=0.03)  # no judgement: no wait named
    assert capsys.readouterr().out.splitlines() == [
        "step 3  loss 1  | time 30ms, slowest trainer_r2 late at comm/all_reduce +13.1ms",
        "step 4  loss 1  | time 30ms",
    ]


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
    record = NonFinite(step=5, key="loss", process="trainer_r1", count=1)
    backend.log_anomaly(record, 5)  # a sink's detector named it: the view does not again
    backend.log_batch([M("loss", float("nan"), Reduce.MEAN)], 5)
    assert capsys.readouterr().out.splitlines() == [
        "!!! step 5 non-finite value: loss from trainer_r1 (1 in the step)",
        "step 5  loss nan",
    ]


def test_an_interrupted_step_is_said_with_no_time(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    backend.log_anomaly(Interrupted(step=9, processes=("trainer_r1",), count=1), 9)
    sink_view(backend, 9)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "!!! step 9 interrupted: the job ended before every process closed it (trainer_r1 had not)"
    assert len(lines) == 2 and "trainer/loss 0.1871" in lines[1] and "| time" not in lines[1]


def test_a_step_a_process_failed_in_names_it_and_its_error_not_an_interruption(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    failed, errors = ("trainer_r1",), ("ZeroDivisionError: division by zero",)
    backend.log_anomaly(Interrupted(step=3, processes=("trainer_r0",), count=1, failed=failed, errors=errors), 3)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "!!! step 3 failed: trainer_r1 raised ZeroDivisionError: division by zero; trainer_r0 had not closed it"
    ]


def test_a_streak_of_corrected_steps_is_one_line_not_a_line_per_step(capsys, monkeypatch) -> None:
    """A node back after an outage: each of its steps' late updates comes with a ``corrected``
    record; the console says the streak once, and prints none of the steps' corrected lines."""
    monkeypatch.setenv("COLUMNS", "400")
    backend = ConsoleBackend({"logging_mode": "global_reduce"})
    for step in range(4):
        sink_view(backend, step)
    capsys.readouterr()
    arrived = ("trainer_r4", "trainer_r5")
    for step in range(4):
        backend.log_anomaly(Corrected(step=step, processes=arrived, count=2, missing=0), step)
        backend.log_batch(global_step(step, 0.5), step, late=True, labels={}, missing=[], phase_times={})
    assert capsys.readouterr().out.splitlines() == [
        "!!! step 0 corrected: trainer_r4, trainer_r5 arrived late, merged: the exact total"
    ]
    backend.log_batch(global_step(3, 0.25), 3, late=True, labels={}, missing=[], phase_times={})  # no arrival
    assert "step 3 (late update)" in capsys.readouterr().out  # a late part of a process that was there
    # its extent is said once it ends: here a new streak of the same processes after a gap
    backend.log_anomaly(Corrected(step=9, processes=arrived, count=2, missing=0), 9)
    assert capsys.readouterr().out.splitlines() == [
        "!!! steps 0-3 corrected (4 steps): trainer_r4, trainer_r5 arrived late, merged: the exact totals",
        "!!! step 9 corrected: trainer_r4, trainer_r5 arrived late, merged: the exact total",
    ]
    backend.log_anomaly(Corrected(step=10, processes=arrived, count=2, missing=0), 10)
    backend.log_anomaly(Corrected(step=10, processes=arrived, count=2, missing=0), 10)  # a second late part
    backend.finish()  # the run's end
    assert capsys.readouterr().out.splitlines() == [
        "!!! steps 9-10 corrected (2 steps): trainer_r4, trainer_r5 arrived late, merged: the exact totals"
    ]


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


def test_at_a_shared_sink_each_runs_lines_say_whose_they_are_once_another_run_prints(capsys, monkeypatch) -> None:
    """A sink holds a console per run, all on its stdout: alone (a job's own sink) a run's lines are
    as everywhere; beside another run's, each line starts with its experiment and run."""
    monkeypatch.setenv("COLUMNS", "400")
    first = ConsoleBackend({"logging_mode": "global_reduce"})
    first.init(None, experiment="grpo", run="20261201-043225-d01632db", role="sink")
    per_rank = ConsoleBackend({"logging_mode": "per_rank_reduce"})  # the same run's other console
    per_rank.init(None, experiment="grpo", run="20261201-043225-d01632db", role="sink")
    first.log_batch([M("loss", 0.5, Reduce.MEAN)], 0)
    assert capsys.readouterr().out.splitlines() == ["step 0  loss 0.5"]
    second = ConsoleBackend({"logging_mode": "global_reduce"})
    second.init(None, experiment="sft", run="r1", role="sink")
    first.log_batch([M("loss", 0.25, Reduce.MEAN)], 1)
    second.log_anomaly(Corrected(step=0, processes=("trainer_r4",), count=1, missing=0), 0)
    assert capsys.readouterr().out.splitlines() == [
        "[grpo · d01632db] step 1  loss 0.25",
        "[sft · r1] !!! step 0 corrected: trainer_r4 arrived late, merged: the exact total",
    ]
    second.finish()  # its run closed: the other is alone again
    first.log_batch([M("loss", 0.125, Reduce.MEAN)], 2)
    assert capsys.readouterr().out.splitlines() == ["step 2  loss 0.125"]
    first.finish()
    per_rank.finish()


def test_a_line_starts_by_clearing_a_bar_only_on_a_terminal_that_takes_ansi(tmp_path, monkeypatch) -> None:
    """``fresh_line``: a terminal gets a carriage return and erase-in-line (a progress bar there is
    cleared, not run into); a file, a closed stream and ``TERM=dumb`` get nothing."""
    monkeypatch.setenv("TERM", "xterm")
    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as terminal, open(tmp_path / "log", "w") as file:
            assert fresh_line(terminal) == ERASE_LINE == "\r\x1b[K"
            assert fresh_line(file) == ""
            monkeypatch.setenv("TERM", "dumb")
            assert fresh_line(terminal) == ""
        assert fresh_line(file) == ""  # closed
    finally:
        os.close(master)
        os.close(slave)
