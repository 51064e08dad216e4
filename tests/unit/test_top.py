"""``rankscope top``'s screen from one snapshot of a sink's routes (``cli.top.render``, a pure
function); the live view over a real sink is ``tests/e2e/test_top.py``."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from rankscope.cli.top import render


def streak(first: int, last: int, who: str = "trainer_r2", **more: Any) -> dict[str, Any]:
    """The sink's record of a straggler streak as the status route keeps it (updated as it goes on)."""
    record = {"type": "straggler", "step": first, "first_step": first, "last_step": last, "steps": last - first + 1}
    record |= {"process": who, "role": "trainer", "replica": None, "rank": int(who[-1]), "phase": "train/forward"}
    record |= {"collective": "all_reduce", "ratio": 352.5876, "excess_s": 0.15012, "late_s": 0.1498}
    return {**record, "waited_s_max": 0.15, "waiting": 3, **more}


def screen(status: dict[str, Any], last_anomalies: list[dict[str, Any]] | None = None) -> str:
    recent = [
        {"step": step, "time": 100.0 + step, "values": {"loss": 1.0 / step}, "missing": [], "phases": {}}
        for step in range(1, 15)
    ]
    recent[-1]["anomalies"] = last_anomalies or []
    snap = {"experiments": [{"id": "exp", "run": "r", "processes": 4, "last_finalized_step": 14}], "experiment": "exp"}
    snap |= {"run": "r", "status": status, "recent": recent}
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(snap, None, now=120.0))
    return console.export_text()


def test_top_shows_the_streak_going_on_its_cause_since_when_and_who_waited() -> None:
    ended = streak(3, 6, "trainer_r1", collective=None, waited_s_max=None, waiting=0)
    status = {"processes": 4, "anomaly_counts": {"straggler": 2}, "anomalies": [ended, streak(9, 14)]}
    lines = [line.strip() for line in screen(status).splitlines() if line.startswith("straggler")]
    assert lines == [
        "straggler: trainer_r2 in train/forward since step 9 (6 steps), +150.1ms (352.6x the others); "
        "arrived last at all_reduce, 3 others waited up to 150ms"
    ]  # the streak that ended at step 6 is not going on: the anomalies line lists it


def test_without_the_status_routes_records_the_last_steps_own_are_shown() -> None:
    started = streak(14, 14, "trainer_r3", collective=None, waiting=0, waited_s_max=0.0012)
    lines = [line.strip() for line in screen({}, [started]).splitlines() if line.startswith("straggler")]
    assert lines == [
        "straggler: trainer_r3 in train/forward since step 14 (1 step), +150.1ms (352.6x the others); "
        "others waited up to 1.2ms"
    ]


def test_the_phase_map_marks_the_late_process_net_of_waits_not_the_rank_that_waited() -> None:
    """trainer_r0 waited 150 ms in backward for trainer_r1's forward: its backward is the slowest
    cell, but the sink's marks name trainer_r1 in forward and nobody in backward; the streak line
    says the others waited in backward when no collective span showed it."""
    recent = [
        {
            "step": 9,
            "time": 109.0,
            "values": {"loss": 1.0},
            "missing": [],
            "phases": {
                "train/forward": {"trainer_r0": 0.003, "trainer_r1": 0.153},
                "train/backward": {"trainer_r0": 0.155, "trainer_r1": 0.005},
            },
            "late": {"train/forward": "trainer_r1"},
            "anomalies": [],
        }
    ]
    record = streak(8, 9, "trainer_r1", collective=None, waited_s_max=None, waiting=0, rule="shortest_sync")
    record["sync_phase"] = "train/backward"
    status = {"processes": 2, "anomaly_counts": {"straggler": 1}, "anomalies": [record]}
    snap = {"experiments": [{"id": "exp", "run": "r", "processes": 2, "last_finalized_step": 9}], "experiment": "exp"}
    snap |= {"run": "r", "status": status, "recent": recent}
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(snap, None, now=110.0))
    text = console.export_text()
    assert "seconds per phase, step 9 (* late)" in text
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ trainer_r")}
    assert "0.153*" in rows["trainer_r1"] and "*" not in rows["trainer_r0"], text
    assert (
        "straggler: trainer_r1 in train/forward since step 8 (2 steps), +150.1ms (352.6x the others); "
        "the others waited for it in train/backward (collectives unseen)" in text
    ), text


def test_top_lists_an_outlier_going_on_with_its_key_against_the_others() -> None:
    record = {"type": "outlier", "step": 10, "first_step": 10, "last_step": 14, "steps": 5, "process": "trainer_r1"}
    record |= {"role": "trainer", "rank": 1, "key": "loss", "value": 6.02, "others_mean": 1.01, "others_std": 0.02}
    record |= {"sigmas": 250.5, "others": 3}
    status = {"processes": 4, "anomaly_counts": {"outlier": 1}, "anomalies": [], "outlier_streaks": [record]}
    lines = [line.strip() for line in screen(status).splitlines() if line.startswith("outlier")]
    assert lines == ["outlier: trainer_r1 loss 6.02 vs the others 1.01 ± 0.02 (+250.5σ) since step 10 (5 steps)"]
