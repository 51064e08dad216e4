"""Every run's views on a bounded pool of threads: order per run, turns across runs, bounds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rankscope.backends.base import LoggerBackend, Metric, register_backend
from rankscope.metrics.reduce import Reduce
from rankscope.sink.testing import FairLine, StepView, ViewPool, ViewWriter

WRITTEN: list[tuple[str, int, str]] = []
"""(experiment, step, thread name) of every step a ``Recording`` view wrote."""
GATE = threading.Event()


class Recording(LoggerBackend):
    """A view that notes what it wrote and on which thread (``gate``: waits for the test first)."""

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        self.experiment = str(kwargs.get("experiment"))

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.logger_backend_config.get("gate"):
            GATE.wait(10)
        WRITTEN.append((self.experiment, int(global_step or 0), threading.current_thread().name))


register_backend("recording-test", Recording)


def spawner(threads: list[threading.Thread]) -> Callable[[str, Callable[[], None]], threading.Thread]:
    def spawn(name: str, target: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        threads.append(thread)
        thread.start()
        return thread

    return spawn


def view(experiment: str, step: int) -> StepView:
    return StepView(experiment, step, 0, [Metric("loss", float(step), Reduce.MEAN, 0.0)], [], False)


def test_many_runs_share_a_few_threads_and_each_runs_steps_stay_in_order() -> None:
    WRITTEN.clear()
    threads: list[threading.Thread] = []
    pool = ViewPool(3, spawner(threads))
    errors: list[str] = []
    writers = [
        ViewWriter(
            f"e{i}",
            {"r": {"backend": "recording-test", "logging_mode": "global_reduce"}},
            lambda w, e: errors.append(w),
            pool,
        )
        for i in range(50)
    ]
    for step in range(40):
        for writer in writers:
            writer.step(view(writer.experiment, step))
    for writer in writers:
        assert writer.wait_idle(10)
        writer.close(10)
    pool.stop(10)
    assert len(threads) == 3 and not any(t.is_alive() for t in threads)
    assert errors == []
    for writer in writers:
        steps = [s for e, s, _ in WRITTEN if e == writer.experiment]
        assert steps == list(range(40))  # every step once, in order
    assert {name for _, _, name in WRITTEN} <= {t.name for t in threads}


def test_a_stuck_run_holds_one_thread_while_the_others_go_on() -> None:
    WRITTEN.clear()
    GATE.clear()
    threads: list[threading.Thread] = []
    pool = ViewPool(2, spawner(threads))
    stuck = ViewWriter(
        "stuck",
        {"r": {"backend": "recording-test", "logging_mode": "global_reduce", "gate": True}},
        lambda *_: None,
        pool,
    )
    fine = ViewWriter(
        "fine", {"r": {"backend": "recording-test", "logging_mode": "global_reduce"}}, lambda *_: None, pool
    )
    stuck.step(view("stuck", 0))
    for step in range(100):
        fine.step(view("fine", step))
    assert fine.wait_idle(10)  # 100 steps, in turns of a few, while the other thread waits on the gate
    assert [s for e, s, _ in WRITTEN if e == "fine"] == list(range(100))
    assert not any(e == "stuck" for e, _, _ in WRITTEN)
    GATE.set()
    assert stuck.wait_idle(10)
    stuck.close(10), fine.close(10), pool.stop(10)


def test_a_full_inbox_drops_and_counts_but_never_drops_a_close_or_a_wait() -> None:
    WRITTEN.clear()
    GATE.clear()
    threads: list[threading.Thread] = []
    pool = ViewPool(1, spawner(threads))
    writer = ViewWriter(
        "full",
        {"r": {"backend": "recording-test", "logging_mode": "global_reduce", "gate": True}},
        lambda *_: None,
        pool,
        max_queued=4,
    )
    for step in range(10):
        writer.step(view("full", step))
    assert writer.dropped >= 5
    GATE.set()
    assert writer.wait_idle(10)
    writer.close(10)
    assert writer.closed.is_set()
    assert writer.wait_idle(0.1)  # a closed writer answers at once: nobody waits on it forever
    assert writer.report(None, 0.1) == []
    pool.stop(10)


def test_the_pool_grows_past_views_stuck_longer_than_the_stall_up_to_its_bound() -> None:
    WRITTEN.clear()
    GATE.clear()
    threads: list[threading.Thread] = []
    pool = ViewPool(1, spawner(threads), max_workers=2, stall=0.2)
    gated = {"r": {"backend": "recording-test", "logging_mode": "global_reduce", "gate": True}}
    stuck = [ViewWriter(f"stuck{i}", gated, lambda *_: None, pool) for i in range(3)]
    fine = ViewWriter(
        "fine", {"r": {"backend": "recording-test", "logging_mode": "global_reduce"}}, lambda *_: None, pool
    )
    stuck[0].step(view("stuck0", 0))
    time.sleep(0.5)  # the one thread has been held past the stall
    stuck[1].step(view("stuck1", 0))  # a second thread is added: it takes this run, and is held too
    time.sleep(0.5)
    for writer in (stuck[2], fine):
        writer.step(view(writer.experiment, 0))
    assert pool.threads == 2  # the bound: stuck runs never take every thread the sink may have
    assert not fine.wait_idle(0.3)  # both threads are held: the others wait, bounded
    GATE.set()
    assert fine.wait_idle(10) and all(w.wait_idle(10) for w in stuck)
    assert {e for e, _, _ in WRITTEN} == {"stuck0", "stuck1", "stuck2", "fine"}
    for writer in (*stuck, fine):
        writer.close(10)
    pool.stop(10)


def test_drops_are_counted_by_kind_of_data_handed_on_and_said_once_per_interval(caplog: Any) -> None:
    """What a full inbox (or a closed writer) drops is counted by kind for the status route, and
    handed to the sink's sum; the log says it once, not once per message."""
    WRITTEN.clear()
    GATE.clear()
    threads: list[threading.Thread] = []
    pool = ViewPool(1, spawner(threads))
    handed: list[str] = []
    writer = ViewWriter(
        "drops",
        {"r": {"backend": "recording-test", "logging_mode": "global_reduce", "gate": True}},
        lambda *_: None,
        pool,
        max_queued=2,
        on_drop=handed.append,
    )
    writer.step(view("drops", 0))  # the view holds it (the gate), two more fit in the inbox
    deadline = time.monotonic() + 10
    while writer._inbox and time.monotonic() < deadline:  # the pool thread took it
        time.sleep(0.01)
    late = StepView("drops", 0, 0, [], [], True)
    for step in range(1, 5):
        writer.step(view("drops", step))
    writer.step(late)
    writer.anomaly({"kind": "x"}, 1)
    assert writer.drops == {
        "step_views": 2,
        "late_updates": 1,
        "streamed_values": 0,
        "sample_rows": 0,
        "log_records": 0,
        "anomaly_records": 1,
    }
    assert writer.dropped == 4 and handed == ["step_views", "step_views", "late_updates", "anomaly_records"]
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(said) == 1 and "views of drops are too slow: dropped 1 updates (1 step_views in all" in said[0]
    GATE.set()
    writer.close(10)
    writer.step(view("drops", 9))  # after close: dropped too, and counted
    assert writer.drops["step_views"] == 3 and handed[-1] == "step_views"
    pool.stop(10)


def test_a_flood_of_new_runs_says_a_few_lines_not_one_each() -> None:
    """Each new run's views said where they write (an INFO line per run, unthrottled: a flood of
    runs wrote a line each). At most ``most`` a window now, the next one counting those not said."""
    from rankscope.sink.testing import SaidLines

    lines = SaidLines(most=3, interval=60.0)
    said = [lines.say() for _ in range(10)]
    assert said == [0, 0, 0] + [None] * 7
    lines._since -= 61.0  # the window passed
    assert lines.say() == 7 and lines.say() == 0


def test_the_line_serves_one_clients_runs_after_anothers_whatever_their_number() -> None:
    """A client with 1,000 runs waiting puts one turn, not 1,000, ahead of another client's run
    (a flood of busy runs made an honest run's steps 9-46 s late)."""
    line: FairLine[str] = FairLine()
    for i in range(1000):
        line.put("flood", f"flood-{i}")
    line.put("victim", "victim-0")
    line.put("other", "other-0")
    line.put("victim", "victim-1")
    served = [line.get() for _ in range(6)]
    assert served == ["flood-0", "victim-0", "other-0", "flood-1", "victim-1", "flood-2"]
    assert len(line) == 997
    line.end()  # the threads end once the line is empty, not before
    assert [line.get() for _ in range(997)][-1] == "flood-999"
    assert line.get() is None


def test_a_pool_writes_a_victims_step_before_most_of_a_flood_queued_ahead_of_it() -> None:
    """Through the pool itself: one thread, held while 200 flood runs' steps are queued, then the
    victim's step: written within the first turns, not after the 200."""
    WRITTEN.clear()
    GATE.clear()
    threads: list[threading.Thread] = []
    pool = ViewPool(1, spawner(threads), max_workers=1)
    errors: list[str] = []

    def writer(experiment: str, client: str, gate: bool = False) -> ViewWriter:
        config = {"r": {"backend": "recording-test", "logging_mode": "global_reduce", "gate": gate}}
        return ViewWriter(experiment, config, lambda w, e: errors.append(w), pool, client=client)

    gated = writer("gate", "g", gate=True)
    gated.step(view("gate", 0))  # holds the one thread until GATE
    flood = [writer(f"flood-{i}", "flood") for i in range(200)]
    victim = writer("victim", "victim")
    for w in flood:
        w.step(view(w.experiment, 1))
    victim.step(view("victim", 1))
    GATE.set()
    for w in [gated, *flood, victim]:
        assert w.wait_idle(30)
        w.close(10)
    pool.stop(10)
    order = [experiment for experiment, _, _ in WRITTEN]
    assert len(order) == 202 and errors == [], (len(order), errors[:3])
    assert order.index("victim") <= 3, order[:5]
