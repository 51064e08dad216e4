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
