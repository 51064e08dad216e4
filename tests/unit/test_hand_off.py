"""A flushed step's hand-off to the export thread: a plain tuple for host values and phases
(``Recorder.hand_off``, ``ExportThread.hand_off``), its batch made and held on the export thread.

On a real export thread over a scripted sender: the bound counts handed steps without its lock and
refuses exactly the ones past it; a shutdown whose export thread is stuck counts every recorded
point still waiting as lost once, handed and submitted steps alike, and never the recycled
accumulators no value reached.
"""

from __future__ import annotations

import threading
import time
import warnings

from opentelemetry.sdk.resources import Resource

from rankscope.core import names as attr
from rankscope.export.local_views import BackendSet
from rankscope.export.senders import SENT, Attempt, Signal
from rankscope.export.thread import ExportThread
from rankscope.metrics.recorder import Recorder, StepBatch, as_batch
from rankscope.metrics.reduce import Reduce

RESOURCE = Resource.create({"service.name": "trainer", attr.EXPERIMENT_ID: "hand-off", attr.RANK: "0"})


class Stuck:
    """A sender whose first send never returns until ``release`` (it ignores its deadline, as a
    wedged transport would); its shutdown does not free it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    @property
    def target(self) -> str:
        return "127.0.0.1:1"

    def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
        self.entered.set()
        self.release.wait(30)
        return SENT

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        pass


def _thread(recorder: Recorder, sender: Stuck, max_steps: int = 300) -> ExportThread:
    return ExportThread(
        resource=RESOURCE,
        recorder=recorder,
        backends=BackendSet([], {}, "trainer_r0"),
        sender=sender,
        export_interval=0.05,
        max_queued_steps=max_steps,
        periodic=lambda: False,
        on_error=lambda where, exc: (_ for _ in ()).throw(exc),
    )


def _record(recorder: Recorder, keys: int, step: int) -> None:
    for k in range(keys):
        recorder.record(f"k{k}", float(step), Reduce.MEAN)


def test_a_step_of_host_values_is_handed_over_as_a_tuple_and_becomes_its_batch_on_the_export_thread() -> None:
    recorder = Recorder(streams=[])
    _record(recorder, 3, 0)
    recorder.phases.append(("train", "forward", 1, 2, None))
    handed = recorder.hand_off(0, (5, 9))
    assert type(handed) is tuple and recorder.accs == {} and recorder.phases == []
    batch = as_batch(handed)
    assert (batch.step, sorted(batch.accs), batch.root_span) == (0, ["k0", "k1", "k2"], (5, 9))
    assert batch.phases == [("train", "forward", 1, 2, None)] and batch.start_time_unix_nano <= batch.time_unix_nano
    assert recorder.take_periodic(grace=60.0) is None  # a periodic ask waits: the step is taken as a batch
    assert recorder.hand_off(1, None) is None


def test_handed_steps_past_the_bound_are_refused_and_counted_without_its_lock() -> None:
    sender, recorder = Stuck(), Recorder(streams=[])
    thread = _thread(recorder, sender, max_steps=5)
    try:
        for step in range(12):
            _record(recorder, 4, step)
            handed = recorder.hand_off(step, None)
            assert handed is not None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                thread.hand_off(handed)
            if step == 0:
                assert sender.entered.wait(10)  # the first round is stuck in its send: nothing leaves
        # 5 held (taken in, or still in the inbox), the other 7 refused: each of their 4 points counted
        assert thread.dropped_total == 7 * 4
        assert thread.bound.handed - thread.bound.received + thread.bound._steps == 5
    finally:
        sender.release.set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            thread.shutdown(5)


def test_a_stuck_shutdown_counts_the_recorded_points_of_handed_and_submitted_steps_once() -> None:
    sender, recorder = Stuck(), Recorder(streams=[])
    thread = _thread(recorder, sender)
    try:
        _record(recorder, 2, 0)
        thread.hand_off(recorder.hand_off(0, None))  # type: ignore[arg-type]
        assert sender.entered.wait(10)  # the export thread is stuck sending step 0 from here on
        recorder.recycle({f"k{k}": Reduce.MEAN.accumulator_class(Reduce.MEAN) for k in range(6)})
        for step in (1, 2, 3):  # handed: step 1 starts with 6 recycled MEANs, 2 of which a value reaches
            _record(recorder, 2, step)
            thread.hand_off(recorder.hand_off(step, None))  # type: ignore[arg-type]
        _record(recorder, 3, 4)
        batch = recorder.take(4)  # submitted, as a step with device values would be
        assert isinstance(batch, StepBatch)
        thread.submit(batch)
        time.sleep(0.2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            thread.shutdown(0.2)
        said = [str(w.message) for w in caught]
        # step 0 (2 points) is in the stuck send: held, so lost; steps 1-3 hold 2 recorded points each, step 4 three
        assert thread.dropped_total == 2 + 3 * 2 + 3, said
        assert any("did not finish exporting" in w for w in said), said
    finally:
        sender.release.set()


def test_a_step_without_phases_hands_over_none_not_the_list_the_next_steps_phases_go_to() -> None:
    """Step 0 has no phases, step 1 has one: step 0's batch, made later on the export thread, must
    not find step 1's phase (counted and spanned twice)."""
    recorder = Recorder(streams=[])
    _record(recorder, 1, 0)
    first = recorder.hand_off(0, None)
    recorder.phases.append(("train", "forward", 1, 2, None))  # step 1's, before the export thread takes step 0
    second = recorder.hand_off(1, None)
    assert first is not None and second is not None
    assert as_batch(first).phases is None
    assert as_batch(second).phases == [("train", "forward", 1, 2, None)]


def test_a_handed_step_takes_the_recycled_accumulators_as_a_taken_one_does() -> None:
    recorder = Recorder(streams=[])
    _record(recorder, 3, 0)
    first = recorder.hand_off(0, None)
    _record(recorder, 3, 1)
    assert first is not None
    made = dict(first[3])
    recorder.recycle(first[3])  # the export thread is done with step 0, during step 1
    assert recorder.hand_off(1, None) is not None  # step 2 starts with step 0's MEANs in place
    _record(recorder, 2, 2)
    third = recorder.hand_off(2, None)
    assert third is not None
    assert all(third[3][key] is made[key] for key in ("k0", "k1", "k2"))  # the same objects, reset and reused
    assert third[3]["k0"].count == 1 and third[3]["k2"].count == 0  # k2 waits unused: dropped before it is read
    assert recorder.drop_unrecorded(as_batch(third)) == 1


def test_submitted_steps_count_the_handed_ones_not_yet_taken_in_against_the_bound() -> None:
    """A loop mixing host-only steps (handed) with device-value steps (submitted) holds at most the
    bound's steps in all."""
    from rankscope.export.outboxes import StepBound

    bound = StepBound(4)
    for _ in range(3):
        assert bound.has_room()
        bound.hand()
    assert bound.hold(1) and not bound.hold(1) and not bound.has_room()  # 3 in flight + 1 held
    bound.hold_received(1)  # one of the handed is taken in: still 4 in all
    assert not bound.hold(1) and not bound.has_room()
    bound.release(2, 2)
    assert bound.has_room() and bound.hold(1)


def test_steps_taken_from_the_inbox_together_are_all_held_before_the_first_is_handled() -> None:
    """The export thread takes up to 256 messages at once; stuck on the first (a backend's
    ``log_batch``), the others must already count in the bound, or a stuck shutdown loses them
    uncounted."""
    sender, recorder = Stuck(), Recorder(streams=[])
    thread = _thread(recorder, sender)
    try:
        items: list = []
        for step in range(3):
            _record(recorder, 2, step)
            items.append(recorder.hand_off(step, None))
        thread._messages.take_in(items)
        assert [type(m) for m in items] == [StepBatch] * 3 and [m.step for m in items] == [0, 1, 2]
        assert (thread.bound._steps, thread.bound._points, thread.bound.received) == (3, 6, 3)
    finally:
        sender.release.set()
        thread.bound.release(3, 6)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            thread.shutdown(5)
