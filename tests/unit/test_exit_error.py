"""A process that an exception ended says so with its goodbye (``rankscope.exit.error``): what the
sink's edge takes of it, whatever a client sends, and the record of the step the job ended in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from rankscope.core import names as attr
from rankscope.core.anomalies import Interrupted
from rankscope.core.identity import speaker
from rankscope.lifecycle.shutdown import describe_error
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.markers import EXIT_ERROR_CHARS
from rankscope.otlp.templates import MetricEncoder
from rankscope.sink import BookConfig, StepBook
from rankscope.sink.testing import Limits, Refusals, metrics_batches

SCOPE = InstrumentationScope(name="rankscope")


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def resource(rank: int) -> dict[str, object]:
    return {
        attr.EXPERIMENT_ID: "x",
        attr.SERVICE_INSTANCE_ID: f"p{rank}",
        attr.ROLE: "trainer",
        attr.RANK: rank,
        attr.WORLD_SIZE: 2,
    }


def request(
    rank: int,
    step: int | None,
    value: float | None,
    *,
    closes: bool,
    bye: str | None = None,
    bye_step: int | None = None,
) -> bytes:
    """Process ``rank``'s request: a value of ``loss`` in ``step`` (closed or not), and a goodbye."""
    encoder = MetricEncoder(encode_resource(resource(rank)), SCOPE)
    metrics: list[bytes] = []
    if value is not None:  # without a step: recorded after the process's last close
        acc = Reduce.MEAN.accumulator_class(Reduce.MEAN)
        acc.append(value)
        metrics += encoder.step(step, 1, 2, {"loss": acc})
    if step is not None and closes:
        metrics.append(encoder.marker(step, 1, 1, 2, 0, False))
    if bye is not None:
        metrics.append(encoder.goodbye(bye or None, bye_step))
    return encoder.request(metrics)


def take(book: StepBook, data: bytes) -> None:
    refused = Refusals()
    for batch in metrics_batches(ExportMetricsServiceRequest.FromString(data), Limits(), refused):
        book.apply(batch, refused)
    assert refused.count == 0, refused


def test_the_step_the_job_ended_in_names_who_failed_and_why() -> None:
    book = StepBook("x", BookConfig(grace=60), clock=Clock())
    take(book, request(0, 0, 1.0, closes=True))
    take(book, request(1, 0, 3.0, closes=True))
    take(book, request(0, 1, 1.0, closes=False))  # rank 0 is in step 1 when rank 1 raises
    take(book, request(1, 1, 2.0, closes=False, bye="ZeroDivisionError: division by zero"))
    views = book.ready(force=True)  # the job ended: rank 0 was killed, no goodbye
    (record,) = [a for v in views for a in v.anomalies if isinstance(a, Interrupted)]
    assert record.step == 1 and record.processes == ("trainer_r0", "trainer_r1")  # neither closed it
    assert record.failed == ("trainer_r1",) and record.errors == ("ZeroDivisionError: division by zero",)


def test_the_process_that_failed_first_is_named_first_as_the_likeliest_cause() -> None:
    """Rank 1 raises; rank 0, waiting in a collective with it, fails because its peer is gone.
    Rank 0 came first to the run, but rank 1's goodbye came first: it is named first."""
    book = StepBook("x", BookConfig(grace=60), clock=Clock())
    take(book, request(0, 0, 1.0, closes=True))
    take(book, request(1, 0, 3.0, closes=True))
    take(book, request(1, 1, 2.0, closes=False, bye="ZeroDivisionError: division by zero"))
    take(book, request(0, 1, 1.0, closes=False, bye="RuntimeError: Connection closed by peer"))
    views = book.ready(force=True)
    (record,) = [a for v in views for a in v.anomalies if isinstance(a, Interrupted)]
    assert record.failed == ("trainer_r1", "trainer_r0")
    assert record.errors == ("ZeroDivisionError: division by zero", "RuntimeError: Connection closed by peer")


def goodbye_with(value: object) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    scope = req.resource_metrics.add(resource=encode_resource(resource(1))).scope_metrics.add(scope=SCOPE)
    bye = scope.metrics.add(name=attr.GOODBYE)
    bye.sum.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_DELTA
    point = bye.sum.data_points.add(time_unix_nano=1, as_int=1)
    if isinstance(value, bytes):
        point.attributes.append(KeyValue(key=attr.EXIT_ERROR, value=AnyValue(bytes_value=value)))
    else:
        point.attributes.append(key_value(attr.EXIT_ERROR, value))
    return req


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=5000), st.integers(-(2**63), 2**63 - 1), st.floats(), st.booleans(), st.binary(max_size=300)
    )
)
def test_a_hostile_exit_error_is_printable_and_bounded_or_none_and_never_raises(value: object) -> None:
    refused = Refusals()
    (batch,) = metrics_batches(goodbye_with(value), Limits(), refused)
    assert batch.goodbye
    error = batch.exit_error
    if isinstance(value, str) and value:
        assert error is not None and len(error) <= EXIT_ERROR_CHARS and error.isprintable()
    else:
        assert error is None


def test_an_error_is_said_on_one_line_even_when_its_message_cannot_be_made() -> None:
    class RudeError(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe_error(ValueError("a\n  b")) == "ValueError: a b"
    assert describe_error(RudeError()) == "RudeError"
    assert describe_error(KeyError()) == "KeyError"


def test_each_machine_s_first_rank_speaks_for_it_and_every_rank_names_itself() -> None:
    assert speaker({attr.WORLD_SIZE: "1"}) == ("rankscope", True)
    many = {attr.WORLD_SIZE: "8", attr.ROLE: "trainer", attr.RANK: "5"}
    assert speaker({**many, attr.LOCAL_RANK: "1"}) == ("rankscope [trainer_r5]", False)
    assert speaker({**many, attr.LOCAL_RANK: "0"}) == ("rankscope [trainer_r5]", True)
    assert speaker(many) == ("rankscope [trainer_r5]", True)  # its machine unknown: it says it
    assert speaker({**many, attr.ROLE: "t\x1b[2J"})[0] == "rankscope [t?[2J_r5]"


def test_a_rank_that_raised_before_it_recorded_in_its_step_still_gets_the_record_of_the_jobs_end() -> None:
    """Lightning hands values to its loggers only at log steps: a rank that raises between them sent
    nothing of the step it died in, so no step is open at the job's end. The record still comes, in
    a step of its own after the last one both closed."""
    book = StepBook("x", BookConfig(grace=60), clock=Clock())
    for step in (0, 1):
        take(book, request(0, step, 1.0, closes=True))
        take(book, request(1, step, 3.0, closes=True))
    assert [v.step for v in book.ready()] == [0, 1]
    take(book, request(1, None, None, closes=False, bye="RuntimeError: boom at 12"))
    take(book, request(0, None, None, closes=False, bye=""))  # torchrun's SIGTERM: a goodbye without an error
    (view,) = book.ready(force=True)
    (record,) = view.anomalies
    assert isinstance(record, Interrupted) and view.step == 2 and view.global_metrics is not None
    assert record.processes == ("trainer_r0", "trainer_r1") and record.failed == ("trainer_r1",)
    assert record.errors == ("RuntimeError: boom at 12",)
    assert book.ready(force=True) == []  # once


def test_a_failure_long_before_the_jobs_end_makes_no_step_of_its_own() -> None:
    """A rank that raised at step 1 while the others went on: its goodbye was named then; the run's
    end makes no step after the last one."""
    book = StepBook("x", BookConfig(grace=60), clock=(clock := Clock()))
    take(book, request(0, 0, 1.0, closes=True))
    take(book, request(1, 0, 3.0, closes=True))
    take(book, request(1, None, None, closes=False, bye="RuntimeError: boom"))
    for step in (1, 2):
        take(book, request(0, step, 1.0, closes=True))
    clock.now = 61.0
    assert [v.step for v in book.ready()] == [0, 1, 2]
    take(book, request(0, None, None, closes=False, bye=""))
    assert book.ready(force=True) == []


def test_the_record_goes_in_the_step_the_failed_rank_said_it_was_in_when_the_runs_steps_allow_it() -> None:
    """Lightning logs steps 4, 9, 14: a rank that raised in batch 12 was in step 14 (``set_step``),
    and its goodbye says so. A step the run could not have reached (past the step window) is not
    believed: the record goes in the step after the last close."""
    for said, expected in ((14, 14), (9, 10), (10**12, 10), (None, 10)):
        book = StepBook("x", BookConfig(grace=60, step_window=64), clock=Clock())
        for step in (4, 9):
            take(book, request(0, step, 1.0, closes=True))
            take(book, request(1, step, 3.0, closes=True))
        assert [v.step for v in book.ready()] == [4, 9]
        take(book, request(1, None, None, closes=False, bye="RuntimeError: boom at 12", bye_step=said))
        (view,) = book.ready(force=True)
        (record,) = view.anomalies
        assert isinstance(record, Interrupted) and record.step == view.step == expected, said
        assert record.failed == ("trainer_r1",) and record.processes == ("trainer_r0", "trainer_r1")


def test_what_a_failed_rank_recorded_after_its_last_close_goes_in_the_step_its_goodbye_named() -> None:
    """A rank that raised in batch 12 had recorded a value of step 14 (``set_step``) without closing
    it: the value goes in step 14 with the record of the failure, not in the step after its last
    close (10), which would hold a value of another step and the record apart from the step named."""
    for said, expected in ((14, 14), (None, 10), (10**12, 10)):
        book = StepBook("x", BookConfig(grace=60, step_window=64), clock=Clock())
        for step in (4, 9):
            take(book, request(0, step, 1.0, closes=True))
            take(book, request(1, step, 3.0, closes=True))
        assert [v.step for v in book.ready()] == [4, 9]
        take(book, request(1, None, 7.0, closes=False, bye="RuntimeError: boom at 12", bye_step=said))
        (view,) = book.ready(force=True)
        (record,) = view.anomalies
        assert isinstance(record, Interrupted) and record.step == view.step == expected, said
        assert {m.key: m.value for m in view.global_metrics or ()}.get("loss") == 7.0, said
