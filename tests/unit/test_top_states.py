"""``rankscope top``'s states (``cli.top.Follow``): waiting for a sink, waiting for the first step,
live, and run ended (said by the sink, or the sink gone) with the last screen kept; never ``None``
on screen. Snapshots stand in for the sink; ``tests/e2e/test_top.py`` watches a real job."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from rankscope.cli import top
from rankscope.cli.top import Follow, render, snapshot

URL = "http://127.0.0.1:4318"


def text(snap: dict[str, Any], width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(render(snap, None, now=1000.0))
    return console.export_text()


def listed(processes: int = 2, last: int = -1) -> list[dict[str, Any]]:
    return [{"id": "exp", "run": "r1", "processes": processes, "last_finalized_step": last}]


def live(steps: int, ended: bool = False) -> dict[str, Any]:
    """A snapshot of run r1 of exp with ``steps`` finalized steps (the status's runs say if it ended)."""
    status = {"run": "r1", "processes": 2, "runs": [{"run": "r1", "ended": ended}]}
    recent = [
        {"step": s, "time": 990.0 + s, "duration": 0.5, "values": {"loss": 1.0 / (s + 1)}, "missing": []}
        for s in range(steps)
    ]
    snap = {"experiments": listed(2, steps - 1), "experiment": "exp", "run": "r1", "status": status, "recent": recent}
    return {**snap, "ended": top._ended(status)}


def test_before_any_sink_it_waits_for_one_and_says_where_it_looks() -> None:
    follow = Follow(URL, None, look=lambda: URL)
    screen = text(follow.take({"error": f"no answer from {URL}"}))
    assert screen.startswith(f"rankscope top: waiting for a sink: no answer from {URL} yet"), screen
    assert "--sink URL" in screen and "None" not in screen
    assert not follow.stopped and not follow.answered


def test_before_the_first_step_it_waits_naming_the_experiment_and_the_processes_seen() -> None:
    follow = Follow(URL, None)
    nothing = text(follow.take({"experiments": [], "experiment": None, "run": None}))
    assert nothing.strip() == "waiting for the first step (0 processes seen)", nothing
    snap = {"experiments": listed(1), "experiment": "exp", "run": "r1", "status": {"processes": 1}, "recent": []}
    screen = text(follow.take(snap))
    assert "waiting for the first step of exp (1 process seen)" in screen, screen
    assert "None" not in screen and "│ exp        │ r1  │ 1         │ -         │" in screen, screen


def test_the_sinks_own_experiment_names_the_wait_before_its_first_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedded sink announces its experiment: the wait names it before any process sent data."""
    monkeypatch.setattr("rankscope.sink.embedded.discover", lambda: [{"control": URL, "experiment": "job"}])
    follow = Follow(URL, None, look=lambda: URL)
    screen = text(follow.take({"experiments": [], "experiment": None, "run": None}))
    assert "waiting for the first step of job (0 processes seen)" in screen, screen


def test_when_every_process_said_goodbye_the_last_screen_stays_marked_and_polling_stops() -> None:
    follow = Follow(URL, None)
    assert "run ended" not in text(follow.take(live(5)))
    ended = follow.take(live(6, ended=True))  # the sink finalizes its last steps on the goodbyes
    assert ended["ended"] == "every process said goodbye" and not follow.stopped
    final = text(follow.take(live(6, ended=True)))  # nothing new: polling stops
    assert follow.stopped
    assert final.startswith("run ended (every process said goodbye); top stopped watching"), final
    assert "exp  step 5  2 steps/s" in final and "lag" not in final, final  # its last step, no lag any more


def test_a_run_that_ends_keeps_polling_at_most_a_few_times() -> None:
    follow = Follow(URL, None)
    for steps in range(top.SETTLE_POLLS):
        assert not follow.stopped
        follow.take(live(10 + steps, ended=True))
    assert follow.stopped


def test_a_run_said_ended_that_comes_back_is_followed_again() -> None:
    follow = Follow(URL, None)
    follow.take(live(5, ended=True))
    assert follow.take(live(6))["ended"] is None and not follow.stopped  # a restart: its processes came back


def test_when_the_sink_that_answered_is_gone_the_last_screen_stays_marked() -> None:
    follow = Follow(URL, None)
    follow.take(live(4))
    once = text(follow.take({"error": f"no answer from {URL}"}))  # one unanswered poll: the same screen
    assert "exp  step 3" in once and "run ended" not in once and "no answer" not in once, once
    gone = text(follow.take({"error": f"no answer from {URL}"}))
    assert follow.stopped
    assert gone.startswith(f"run ended (the sink at {URL} is gone); top stopped watching"), gone
    assert "exp  step 3" in gone and "│ loss" in gone and "no answer" not in gone, gone


def test_a_sink_gone_before_the_first_step_says_so() -> None:
    follow = Follow(URL, None)
    follow.take({"experiments": listed(1), "experiment": "exp", "run": "r1", "status": {"processes": 1}, "recent": []})
    follow.take({"error": "x"})
    screen = text(follow.take({"error": "x"}))
    assert "run ended (the sink at" in screen and "no step of exp was finalized" in screen, screen


def test_watch_exits_by_itself_once_the_run_ended_leaving_the_last_screen(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = iter([live(3), live(4, ended=True), live(4, ended=True)])
    monkeypatch.setattr(top, "snapshot", lambda *_: next(answers))
    monkeypatch.setattr(top, "ENDED_LINGER", 0.05)
    assert top.watch(URL, None, None, 0.01, None, once=False) == 0
    out = capsys.readouterr().out
    assert "run ended (every process said goodbye); top stopped watching" in out and "exp  step 3" in out, out


def test_snapshot_reads_the_end_of_the_run_from_its_status(monkeypatch: pytest.MonkeyPatch) -> None:
    status = {"run": "r2", "processes": 2, "runs": [{"run": "r2", "ended": True}, {"run": "r1", "ended": True}]}
    routes = {"/rankscope/v1/status": {"experiment_list": listed()}, "/rankscope/v1/recent": []}

    def get(url: str, path: str, query: dict[str, str], token: str | None) -> Any:
        return status if path.endswith("status") and query else routes[path]

    monkeypatch.setattr(top, "_get", get)
    assert snapshot(URL, "exp")["ended"] == "every process said goodbye"
    status["runs"][0]["ended"] = False  # the run shown goes on; an earlier one ended
    assert snapshot(URL, "exp")["ended"] is None


def test_notes_never_say_none() -> None:
    snap = live(3)
    snap["status"] |= {
        "anomalies": [{"type": "capture", "step": None}, {"type": "missing", "step": 2}],
        "captures": [{"id": "c1", "reason": None, "files": None, "taken": None}],
        "first_nonfinite": {"key": "loss", "step": None, "process": None},
        "refused_points": None,
    }
    screen = text(snap)
    assert "anomalies: capture; missing@2" in screen and "capture c1: -" in screen, screen
    assert "first non-finite: loss" in screen and "None" not in screen, screen
