"""The recorder's slow path: what a refused value leaves behind, and the type of a state."""

from __future__ import annotations

import pytest

from rankscope.metrics.recorder import Recorder
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
