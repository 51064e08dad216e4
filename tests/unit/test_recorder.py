"""The recorder's slow path: what a refused value leaves behind, and the type of a state."""

from __future__ import annotations

import pytest

from rankscope.metrics.recorder import Recorder, StepBatch
from rankscope.metrics.reduce import MetricAccumulator, Reduce


def test_a_refused_value_leaves_no_empty_accumulator_to_export() -> None:
    recorder = Recorder(streams=[])
    for key, value, reduce in [("a", "text", Reduce.MAX), ("b", [1.0, 2.0], Reduce.LAST), ("c", object(), Reduce.SUM)]:
        with pytest.raises((TypeError, ValueError)):
            recorder.record(key, value, reduce)  # an instrumentor catches this and goes on
    closed = recorder.take(0)
    assert closed is not None and closed.accs == {}  # the step closes with nothing made up in it
    recorder.record("a", 1.0, Reduce.MAX)
    batch = recorder.take(1)
    assert batch is not None and list(batch.accs) == ["a"]


def test_a_known_keys_first_int_value_of_a_step_is_stored_as_a_float() -> None:
    recorder = Recorder(streams=[])
    states = []
    for step in range(2):
        recorder.record("n", 5, Reduce.MAX)  # step 1 takes the known key's first-value path
        batch = recorder.take(step)
        assert batch is not None
        states.append(batch.accs["n"].get_state())
    assert [type(s["max"]) for s in states] == [float, float]


def test_accumulator_subclasses_keep_their_own_attributes_and_weak_references() -> None:
    import weakref

    class Ema(MetricAccumulator):
        __slots__ = ("value",)

        def __init__(self, reduction: Reduce) -> None:
            super().__init__(reduction)
            self.value = 0.0
            self.alpha = 0.1  # not in __slots__: a subclass may still set its own attributes

    acc = Ema(Reduce.MEAN)
    assert acc.alpha == 0.1 and weakref.ref(acc)() is acc


def test_a_recycled_accumulator_serves_the_keys_next_first_value_empty_and_of_its_own_reduce() -> None:
    from rankscope.metrics import recording

    recorder = Recorder(streams=[])
    recording._follow(recorder, False)  # record_metric's fast path reads this recorder
    try:
        for key, reduce in (("loss", Reduce.MEAN), ("peak", Reduce.MAX), ("n", Reduce.SUM), ("last", Reduce.LAST)):
            recording.record_metric(key, 3.0, reduce)
        first = recorder.take(0)
        assert first is not None
        states = {k: a.get_state() for k, a in first.accs.items()}
        objects = dict(first.accs)
        recorder.recycle(first.accs)  # what the export thread does once the step is encoded
        assert [set(d) for d in recorder.spares_waiting] == [{"loss", "peak", "n", "last"}]
        recording.record_metric("loss", 5.0)
        recording.record_metric("loss", 7.0)
        recording.record_metric("peak", 1.0, Reduce.MAX)
        with pytest.raises(ValueError, match="one key has one reduce type"):
            recording.record_metric("n", 1.0, Reduce.MAX)  # a spare never turns a wrong reduce into a right one
        second = recorder.take(1)
        assert second is not None
        assert second.accs["loss"] is objects["loss"] and second.accs["peak"] is objects["peak"]
        assert second.accs["loss"].get_state() == {"reduction_type": "mean", "sum": 12.0, "count": 2}
        assert second.accs["peak"].get_value() == 1.0  # nothing of step 0's 3.0 is left in it
        assert set(second.accs) == {"loss", "peak"}  # keys not recorded this step are not exported
        assert states["loss"] == {"reduction_type": "mean", "sum": 3.0, "count": 1}  # read before the recycle
    finally:
        recording._follow(None, False)


def test_accumulators_the_export_thread_made_for_deferred_phases_are_not_recycled() -> None:
    """A deferred phase's durations are accumulated on the export thread; the caller never records
    those keys, so their accumulators must not sit in its spares (its thread would free them)."""
    from rankscope.metrics import recording

    recorder = Recorder(streams=[])
    recording._follow(recorder, False)
    try:
        for step in range(2):
            recording.record_metric("loss", 1.0)
            assert recording.defer_phase("t", "fwd", 0, 10**6, None)
            batch = recorder.take(step)
            assert batch is not None
            recorder.resolve_phases(batch)  # the export thread's part
            assert batch.accs["t/fwd/duration_max_s"].get_value() == 0.001
            recorder.recycle(batch.accs)
            assert [set(d) for d in recorder.spares_waiting] == [{"loss"}]
    finally:
        recording._follow(None, False)


def test_a_steps_phase_durations_come_every_mean_before_every_max() -> None:
    """The encoder packs a run of one kind's keys in one call: the phases' MEAN keys join the step's
    MEAN keys and their MAX keys make one run, instead of alternating one by one."""
    from rankscope.metrics import recording

    recorder = Recorder(streams=[])
    recording._follow(recorder, False)
    try:
        recording.record_metric("loss", 1.0)
        for name, start in (("fwd", 0), ("bwd", 10**6), ("fwd", 3 * 10**6)):
            assert recording.defer_phase("t", name, start, start + 10**6, None)
        batch = recorder.take(0)
        assert batch is not None
        recorder.resolve_phases(batch)
        assert list(batch.accs) == [
            "loss",
            "t/fwd/duration_avg_s",
            "t/bwd/duration_avg_s",
            "t/fwd/duration_max_s",
            "t/bwd/duration_max_s",
        ]
        assert batch.accs["t/fwd/duration_avg_s"].get_state()["count"] == 2  # fwd twice in the step
        assert batch.accs["t/bwd/duration_max_s"].get_value() == 0.001
    finally:
        recording._follow(None, False)


def test_gpu_timed_durations_read_before_one_that_fails_are_kept_and_every_event_released() -> None:
    """The export thread reads a step's CUDA-event durations in one pass: one that cannot be read
    (its event failed) raises, and the ones read before it still reach the step."""

    class Events:  # the CUDA-event processor's interface, with the events' times as plain numbers
        def __init__(self) -> None:
            self.held: list[tuple[int, int]] = []

        def hold(self, start: int, end: int) -> None:
            self.held.append((start, end))

        def release(self, start: int, end: int) -> None:
            self.held.remove((start, end))

        def elapsed_s(self, start: int, end: int) -> float:
            if end < start:
                raise RuntimeError("an event that never completed")
            return (end - start) / 1000

    events = Events()
    recorder = Recorder(streams=[])
    recorder.defer("g/fwd/duration_avg_s", "g/fwd/duration_max_s", 0, 2, events)
    recorder.defer("g/bwd/duration_avg_s", "g/bwd/duration_max_s", 5, 4, events)
    batch = recorder.take(0)
    assert batch is not None
    with pytest.raises(RuntimeError, match="never completed"):
        recorder.resolve_deferred(batch)
    assert batch.accs["g/fwd/duration_avg_s"].get_value() == batch.accs["g/fwd/duration_max_s"].get_value() == 0.002
    assert "g/bwd/duration_avg_s" not in batch.accs and events.held == []


def test_a_users_accumulator_type_is_never_recycled() -> None:
    class Ema(MetricAccumulator):
        def __init__(self, reduction: Reduce) -> None:
            super().__init__(reduction)
            self.value = 0.0

        def append(self, value: float) -> None:
            self.value = 0.9 * self.value + 0.1 * value

        def reset(self) -> None:
            raise AssertionError("never reset by rankscope")

    recorder = Recorder(streams=[])
    recorder.recycle({"ema": Ema(Reduce.MEAN), "loss": Reduce.MEAN.accumulator_class(Reduce.MEAN)})
    assert [set(d) for d in recorder.spares_waiting] == [{"loss"}]


def test_a_users_accumulator_is_never_read_for_whether_the_step_used_it() -> None:
    """``drop_unrecorded`` takes out only empty built-in MEAN/STD/COUNT states, and never reads a
    user's state for it: its ``count`` may be a property that raises, a tensor, or 0 by design."""

    class Counted(MetricAccumulator):
        def __init__(self, reduction: Reduce) -> None:
            super().__init__(reduction)

        @property
        def count(self) -> int:
            raise AssertionError("read by rankscope")

        def append(self, value: float) -> None:
            pass

    class Zero(MetricAccumulator):
        count = 0  # its own meaning: not an empty step's state

        def append(self, value: float) -> None:
            pass

    recorder = Recorder(streams=[])
    for empty in (True, False):
        loss = Reduce.MEAN.accumulator_class(Reduce.MEAN)
        if not empty:
            loss.append(1.0)
        accs = {"mine": Counted(Reduce.MEAN), "zero": Zero(Reduce.MEAN), "loss": loss}
        batch = StepBatch(0, 1, 2, accs, None)
        assert recorder.drop_unrecorded(batch) == int(empty)
        assert set(batch.accs) == ({"mine", "zero"} if empty else {"mine", "zero", "loss"})
    peak = Reduce.MAX.accumulator_class(Reduce.MAX)  # built in, no ``count``: kept
    batch = StepBatch(0, 1, 2, {"peak": peak, "n": Reduce.COUNT.accumulator_class(Reduce.COUNT)}, None)
    assert recorder.drop_unrecorded(batch) == 1 and set(batch.accs) == {"peak"}


def test_recycled_steps_are_bounded_by_their_accumulators_not_their_count() -> None:
    """A fast loop's steps come back one export round later (~80 steps of 5 ms in a round): the pool
    keeps as many steps as ``MAX_SPARE_ACCUMULATORS`` holds, so a 100-key loop's first values find
    spares (the bound of 32 steps before left them building accumulators, ~450 us a step); and at
    least one step however large, never two that pass the bound."""
    from rankscope.metrics.recorder import MAX_SPARE_ACCUMULATORS

    def step(keys: int) -> dict[str, MetricAccumulator]:
        return {f"k{i}": Reduce.MEAN.accumulator_class(Reduce.MEAN) for i in range(keys)}

    recorder = Recorder(streams=[])
    fits = MAX_SPARE_ACCUMULATORS // 100
    for _ in range(fits + 5):
        recorder.recycle(step(100))
    assert len(recorder.spares_waiting) == fits and fits >= 256
    assert sum(map(len, recorder.spares_waiting)) <= MAX_SPARE_ACCUMULATORS

    huge = Recorder(streams=[])
    huge.recycle(step(MAX_SPARE_ACCUMULATORS + 1))  # alone: kept, the next step's first values need it
    huge.recycle(step(10))  # past the bound with it: not kept
    assert [len(d) for d in huge.spares_waiting] == [MAX_SPARE_ACCUMULATORS + 1]


def test_a_mean_keys_first_value_lands_in_its_recycled_accumulator_and_an_unused_one_is_not_exported() -> None:
    """The step after a recycle starts with the MEAN/STD/COUNT accumulators in place (a first value
    costs a repeated one's): what no value reached leaves the step before anything reads it, and a
    periodic export of only those is nothing."""
    from rankscope.metrics import recording

    recorder = Recorder(streams=[])
    recording._follow(recorder, False)
    try:
        for key, reduce in (("loss", Reduce.MEAN), ("spread", Reduce.STD), ("n", Reduce.COUNT), ("peak", Reduce.MAX)):
            recording.record_metric(key, 3.0, reduce)
        first = recorder.take(0)
        assert first is not None
        objects = dict(first.accs)
        recorder.recycle(first.accs)
        nothing = recorder.take(1)  # the recycled step becomes step 2's
        assert nothing is not None and recorder.drop_unrecorded(nothing) == 0 and nothing.accs == {}
        assert set(recorder.accs) == {"loss", "spread", "n"} and set(recorder.spare) == {"peak"}
        assert recorder.recorded() == {}  # in place, empty: nothing recorded yet
        assert recorder.take(None) is None  # a periodic export finds nothing to send, and keeps them
        assert set(recorder.accs) == {"loss", "spread", "n"}
        recording.record_metric("loss", 5.0)
        assert recorder.accs["loss"] is objects["loss"] and set(recorder.recorded()) == {"loss"}
        second = recorder.take(2)
        assert second is not None and recorder.drop_unrecorded(second) == 2
        assert set(second.accs) == {"loss"}
        assert second.accs["loss"].get_state() == {"reduction_type": "mean", "sum": 5.0, "count": 1}
        recorder.recycle(second.accs)
        for key, reduce in (("loss", Reduce.MEAN), ("spread", Reduce.STD), ("n", Reduce.COUNT), ("peak", Reduce.MAX)):
            recording.record_metric(key, 2.0, reduce)
        third = recorder.take(3)  # every key reached (a MAX state has no count): nothing leaves
        assert third is not None and recorder.drop_unrecorded(third) == 0
        assert set(third.accs) == {"loss", "spread", "n", "peak"}
        assert third.accs["loss"].get_state() == {"reduction_type": "mean", "sum": 2.0, "count": 1}
    finally:
        recording._follow(None, False)


def test_a_periodic_take_beside_a_thread_recording_new_keys_reads_a_snapshot_of_the_step() -> None:
    """A periodic take asks whether any value reached the step's accumulators while another thread
    may add a key: it reads a copy (walking the live dict raised "changed size during iteration"
    out of the export thread's round, 1 try in 10 here)."""
    import sys
    import threading

    recorder = Recorder(streams=[])
    stop = threading.Event()
    failures: list[BaseException] = []

    def record() -> None:
        n = 0
        while not stop.is_set():
            recorder.record(f"new/{n}", 1.0, Reduce.MEAN)
            n += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    writer = threading.Thread(target=record, daemon=True)
    writer.start()
    try:
        for _ in range(200):
            recycled = {f"k{i}": Reduce.MEAN.accumulator_class(Reduce.MEAN) for i in range(2000)}  # reset, empty
            recorder.accs = recycled
            try:
                recorder.take(None)
            except RuntimeError as exc:
                failures.append(exc)
    finally:
        stop.set()
        writer.join(10)
        sys.setswitchinterval(interval)
    assert not failures, failures[:1]
