"""Sample rows as a hostile client sends them over real OTLP/gRPC: a corpus of rows that decode but
lie, refused with the reason while an honest experiment beside them is unaffected; the sink's
bounds on a step's tables and the characters they hold; a retried request's rows kept once (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as lpb
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as lgrpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource
from rankscope.sink import BookConfig, ExperimentLimits

from ..sample_records import record


def request(records: list[LogRecord], experiment: str, instance: str = "p0") -> lpb.ExportLogsServiceRequest:
    r = lpb.ExportLogsServiceRequest()
    resource = encode_resource({attr.EXPERIMENT_ID: experiment, attr.SERVICE_INSTANCE_ID: instance})
    r.resource_logs.add(resource=resource).scope_logs.add().log_records.extend(records)
    return r


nested = AnyValue()
nested.kvlist_value.values.add(key="a", value=AnyValue()).value.array_value.values.add(int_value=1)

REFUSED: list[tuple[str, LogRecord, str]] = [
    ("a string body", record(body=AnyValue(string_value="reward=1")), "not a map"),
    ("a nested field", record(body=nested), "not a str, int, float or bool"),
    ("a field name with a terminal escape", record({"\x1b[2J": 1.0, "reward": 1.0}), "field name"),
    ("65 fields", record({f"f{i}": i for i in range(64)} | {"reward": 1.0}), "fields (limit 64)"),
    ("side sideways", record(**{attr.SAMPLE_SIDE: "sideways"}), "side must be one of"),
    ("k = 0", record(**{attr.SAMPLE_K: 0}), "must be an int in [1, 1024]"),
    ("k = 5000", record(**{attr.SAMPLE_K: 5000}), "must be an int in [1, 1024]"),
    ("k as a string", record(**{attr.SAMPLE_K: "2"}), "must be an int"),
    ("a key that is not the row's value", record(**{attr.SAMPLE_KEY: 99.0}), "is not the row's 'reward'"),
    ("rank_by missing from the row", record({"score": 1.0}), "is not a number in the row"),
    ("top without rank_by", record(**{attr.SAMPLE_RANK_BY: None}), "without rankscope.sample.rank_by"),
    (
        "a priority of 1.5",
        record(**{attr.SAMPLE_SIDE: "sample", attr.SAMPLE_KEY: 1.5, attr.SAMPLE_RANK_BY: None}),
        "in [0, 1)",
    ),
    ("a negative seq", record(**{attr.SAMPLE_SEQ: -1}), "non-negative int"),
    ("a string step", record(**{attr.STEP: "x"}), "must be an integer"),
    ("a negative policy version", record(**{attr.POLICY_VERSION: -3}), "policy_version"),
    ("an empty table name", record(**{attr.SAMPLE_TABLE: ""}), "bad table name"),
    ("a table name with a newline", record(**{attr.SAMPLE_TABLE: "a\nb"}), "bad table name"),
    ("a step far ahead", record(**{attr.STEP: 10**15}), "ahead"),
]


def test_a_corpus_of_lying_rows_is_refused_with_reasons_and_good_rows_beside_them_are_kept(
    make_sink, tmp_path: Path
) -> None:
    path = tmp_path / "view.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(path)}}, book=BookConfig(grace=30)
    )
    with grpc.insecure_channel(sink.endpoint) as channel:
        logs = lgrpc.LogsServiceStub(channel)
        for i, (name, bad, why) in enumerate(REFUSED):
            good = record({"reward": 5.0, "text": name}, **{attr.SAMPLE_KEY: 5.0, attr.SAMPLE_SEQ: 100 + i})
            answer = logs.Export(request([bad, good], "hostile"), timeout=10).partial_success
            assert answer.rejected_log_records == 1 and why in answer.error_message, (name, answer)
        long = record(
            {"reward": 2.0, "text": "x" * 10_000},
            **{attr.SAMPLE_KEY: 2.0, attr.SAMPLE_SEQ: 2, attr.SAMPLE_SIDE: "both"},
        )
        other = record(
            {"loss": 1.0}, **{attr.SAMPLE_RANK_BY: "loss", attr.SAMPLE_SEQ: 3}
        )  # same table, another selection
        answer = logs.Export(request([long, other], "hostile"), timeout=10).partial_success
        assert answer.rejected_log_records == 1 and "selects by rank_by='reward', k=2" in answer.error_message
        honest = record({"reward": 1.0, "text": "honest"})
        assert logs.Export(request([honest], "honest"), timeout=10).partial_success.rejected_log_records == 0
    for experiment in ("hostile", "honest"):
        sink.finalize(experiment)
        assert sink.wait_written(experiment)
    status = sink.status("hostile")
    assert status["refused_points"] == len(REFUSED) + 1 and status["internal_errors"] == 0
    assert sink.status("honest")["refused_points"] == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    kept = [r for r in rows if r["kind"] == "sample" and r["experiment"] == "hostile"]
    assert [r["row"]["reward"] for r in kept if r["side"] == "top"] == [5.0, 5.0]  # every good row is 5.0 or less
    assert [r["row"]["text"] for r in rows if r["kind"] == "sample" and r["experiment"] == "honest"] == ["honest"]
    (cut,) = [r for r in kept if r["side"] == "bottom"]  # the lowest reward (2.0), its text cut and marked
    assert cut["row"]["text"] == "x" * 4072 + "…[5928 more characters]"


def test_a_steps_tables_and_the_characters_they_hold_are_bounded(make_sink) -> None:
    sink = make_sink(
        book=BookConfig(limits=ExperimentLimits(max_sample_tables=2, max_sample_chars_per_step=1000), grace=0.5)
    )
    with grpc.insecure_channel(sink.endpoint) as channel:
        logs = lgrpc.LogsServiceStub(channel)
        tables = [record(**{attr.SAMPLE_TABLE: f"t{i}"}) for i in range(3)]
        answer = logs.Export(request(tables, "bounded"), timeout=10).partial_success
        assert answer.rejected_log_records == 1 and "2 tables (limit)" in answer.error_message
        big = record(
            {"reward": 0.5, "text": "y" * 2000}, **{attr.SAMPLE_KEY: 0.5, attr.SAMPLE_SEQ: 5, attr.SAMPLE_TABLE: "t0"}
        )
        answer = logs.Export(request([big], "bounded"), timeout=10).partial_success
        assert answer.rejected_log_records == 1 and "1000 characters (limit)" in answer.error_message
    sink.finalize("bounded")
    assert sink.status("bounded")["sample_rows"] == 2


def test_a_retried_request_with_other_bytes_does_not_keep_a_row_twice(make_sink, tmp_path: Path) -> None:
    """A client whose retry carries its earlier rows plus new ones (so another digest): each row
    is kept once, and the top 2 stay exact. A streamed row with a junk key is taken, not raised on."""
    path = tmp_path / "view.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(path)}}, book=BookConfig(grace=30)
    )

    def row(reward: float, seq: int) -> LogRecord:
        return record({"reward": reward}, **{attr.SAMPLE_KEY: reward, attr.SAMPLE_SEQ: seq})

    with grpc.insecure_channel(sink.endpoint) as channel:
        logs = lgrpc.LogsServiceStub(channel)
        for rows in ([row(9.0, 0), row(5.0, 1)], [row(9.0, 0), row(5.0, 1), row(7.0, 2)]):
            assert logs.Export(request(rows, "retried"), timeout=10).partial_success.rejected_log_records == 0
        streamed = record(
            {"reward": 1.0}, **{attr.SAMPLE_SIDE: "stream", attr.SAMPLE_KEY: "abc", attr.SAMPLE_RANK_BY: None}
        )
        assert logs.Export(request([streamed], "retried"), timeout=10).partial_success.rejected_log_records == 0
    sink.finalize("retried")
    assert sink.wait_written("retried")
    kept = [json.loads(line) for line in path.read_text().splitlines() if '"sample"' in line]
    assert [(r["side"], r["row"]["reward"]) for r in kept] == [("top", 9.0), ("top", 7.0)]
