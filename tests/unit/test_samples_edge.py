"""Sample rows at the edges, in process: a fuzzer over the row decoder (a row or a reason, never
an exception), the call site's errors, per-rank views getting every row, and a step of rows
only waiting for its flush marker (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

import rankscope as rs
from rankscope.core import names as attr
from rankscope.otlp import samples as wire
from rankscope.otlp.common import attributes

from ..sample_records import record

nested = AnyValue()
nested.kvlist_value.values.add(key="a", value=AnyValue()).value.array_value.values.add(int_value=1)


@settings(max_examples=300, deadline=None)
@given(
    tags=st.dictionaries(
        st.sampled_from(
            [
                attr.SAMPLE_TABLE,
                attr.SAMPLE_SIDE,
                attr.SAMPLE_KEY,
                attr.SAMPLE_SEQ,
                attr.SAMPLE_K,
                attr.SAMPLE_RANK_BY,
                attr.STEP,
                "other",
            ]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**63), 2**63 - 1),
            st.floats(),
            st.text(max_size=8),
            st.sampled_from(["top", "bottom", "both", "sample", "stream"]),
        ),
    ),
    body=st.dictionaries(
        st.text(max_size=6),
        st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(max_size=20)),
        max_size=6,
    ),
)
def test_the_row_decoder_answers_any_record_with_a_row_or_a_reason_never_raising(
    tags: dict[str, Any], body: dict[str, Any]
) -> None:
    bad = record(body, **tags)
    decoded = wire.decode_row(bad, attributes(bad.attributes), 4096)
    assert isinstance(decoded, (str, wire.SampleRow))


@pytest.mark.parametrize("disable", [False, True])
def test_a_bad_row_raises_at_the_call_site_naming_the_table(disable: bool) -> None:
    rs.init(experiment="call-site", backends={}, disable=disable)
    try:
        with pytest.raises(TypeError, match=r"record_sample\('rollouts'\): field 'ids' is a list"):
            rs.record_sample("rollouts", {"ids": [1, 2]})
        with pytest.raises(ValueError, match=r"record_sample\('rollouts'\): k must be an int in \[1, 1024\]"):
            rs.record_sample("rollouts", {"reward": 1.0}, rank_by="reward", k=0)
        with pytest.raises(ValueError, match="outside int64"):
            rs.record_sample("rollouts", {"big": 2**70})
        rs.record_sample("rollouts", {"reward": 1.0}, rank_by="reward", k=2)
        if not disable:  # a table's selection is the process's to remember: nothing is kept when off
            with pytest.raises(ValueError, match="recorded with rank_by='reward', k=2 before"):
                rs.record_sample("rollouts", {"reward": 1.0}, k=2)
    finally:
        rs.shutdown()


def test_a_per_rank_no_reduce_view_gets_every_row_as_recorded(tmp_path: Path) -> None:
    """Streaming views see every row (kind ``stream``), a per-rank view the process's selection."""
    stream, rank = tmp_path / "stream.jsonl", tmp_path / "rank.jsonl"
    views = {
        "jsonl": {"logging_mode": "per_rank_no_reduce", "path": str(stream)},
        "mine": {"backend": "jsonl", "logging_mode": "per_rank_reduce", "path": str(rank)},
    }
    rs.init(experiment="every-row", backends=views)
    try:
        for i in range(10):
            rs.record_sample("t", {"reward": float(i)}, rank_by="reward", k=2)
        rs.flush(0)
    finally:
        rs.shutdown()
    streamed = [json.loads(line) for line in stream.read_text().splitlines()]
    assert [(r["side"], r["row"]["reward"], r["step"]) for r in streamed] == [
        ("stream", float(i), None) for i in range(10)
    ]
    kept = [json.loads(line) for line in rank.read_text().splitlines() if '"sample"' in line]
    assert [(r["side"], r["row"]["reward"]) for r in kept] == [
        ("top", 9.0),
        ("top", 8.0),
        ("bottom", 0.0),
        ("bottom", 1.0),
    ]


def test_a_step_holding_only_sample_rows_waits_for_its_flush_marker() -> None:
    """Rows go out before their process's marker: the step must not finalize on the rows alone
    (it did, with one rank's rows, before the other ranks' markers said there were four)."""
    from rankscope.otlp.markers import Marker
    from rankscope.sink import BookConfig
    from rankscope.sink.testing import Refusals, ResourceBatch, StepBook

    now = [0.0]
    experiment = StepBook("rows-first", BookConfig(grace=10.0), clock=lambda: now[0])
    resource = {attr.EXPERIMENT_ID: "rows-first", attr.SERVICE_INSTANCE_ID: "p0", attr.RANK: 0, attr.WORLD_SIZE: 2}
    row = wire.SampleRow("t", "reward", 2, "top", 1.0, 0, {"reward": 1.0}, 0, 1, "", "", None)
    experiment.apply(ResourceBatch("rows-first", resource, samples=[row]), Refusals())
    assert experiment.ready() == []  # rows only: wait for a marker
    experiment.apply(ResourceBatch("rows-first", resource, markers=[Marker(0, 0, False, 1)]), Refusals())
    assert experiment.ready() == []  # rank 1 of 2 has not closed step 0
    now[0] = 11.0
    (view,) = experiment.ready()  # the grace ran out: rank 1 is named missing, the rows are kept
    assert view.missing == ["trainer_r1"] or view.missing == ["unknown_r1"]
    assert [r["row"]["reward"] for r in view.samples["t"]] == [1.0]
