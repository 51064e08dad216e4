"""The sink's span store: bounded by steps and spans, oldest first."""

from __future__ import annotations

import json

from opentelemetry.proto.trace.v1 import trace_pb2

from rankscope.otlp.common import key_value
from rankscope.report import perfetto
from rankscope.sink.testing import Process, SpanFile, TraceStore, parse_ranks


def process(rank: int) -> Process:
    return Process(f"p{rank}", f"trainer_r{rank}", "trainer", None, rank, 4, 0, "h", rank, {})


def scope_spans(step: int | None, durations: dict[str, float], trace: int = 1) -> list[trace_pb2.ScopeSpans]:
    ss = trace_pb2.ScopeSpans()
    for i, (name, seconds) in enumerate(durations.items()):
        span = ss.spans.add(
            trace_id=trace.to_bytes(16, "big"),
            span_id=(i + 1).to_bytes(8, "big"),
            parent_span_id=b"\x00" * 7 + b"\x09",
            name=name,
            start_time_unix_nano=1_000,
            end_time_unix_nano=1_000 + int(seconds * 1e9),
        )
        if step is not None:
            span.attributes.append(key_value("rankscope.step", step))
    return [ss]


def test_retention_keeps_the_newest_steps_and_counts_the_rest() -> None:
    store = TraceStore(retain_steps=3, max_spans=10)
    for step in range(5):
        store.ingest(process(0), scope_spans(step, {"a": 0.1, "b": 0.1}))
    assert store.steps() == [2, 3, 4] and store.count == 6
    store.ingest(process(0), scope_spans(0, {"late": 0.1}))  # older than all retained: dropped
    assert store.steps() == [2, 3, 4] and store.dropped == 1
    store.ingest(process(1), scope_spans(4, {f"x{i}": 0.1 for i in range(6)}))  # over max_spans
    assert store.count <= 10 and 4 in store.steps() and 2 not in store.steps()
    store.ingest(process(1), scope_spans(4, {f"y{i}": 0.1 for i in range(20)}))  # one step bigger than the cap
    assert store.count == 10 and store.steps() == [4] and store.dropped > 1


def test_spans_without_a_step_take_their_trace_step_and_bad_ids_are_rejected() -> None:
    store = TraceStore()
    spans = scope_spans(7, {"ours": 0.1}, trace=5)
    spans[0].spans.add(trace_id=(5).to_bytes(16, "big"), span_id=(9).to_bytes(8, "big"), name="users")
    spans[0].spans.add(trace_id=b"short", span_id=(9).to_bytes(8, "big"), name="bad")
    assert store.ingest(process(0), spans) == (2, 1)
    assert sorted(s.name for s in store.spans(7)) == ["ours", "users"]


def test_a_span_query_names_ranks_and_ranges() -> None:
    assert parse_ranks("0,2,4-6") == {0, 2, 4, 5, 6} and parse_ranks("") is None


def test_the_span_file_keeps_the_whole_run_up_to_its_cap_and_says_so(tmp_path) -> None:
    """Memory keeps the last steps; the span file keeps every step until its byte cap, then counts."""
    file = SpanFile(tmp_path / "x" / "spans.jsonl", max_bytes=20_000)
    store = TraceStore(retain_steps=3, file=file)
    for step in range(200):
        store.ingest(process(step % 4), scope_spans(step, {"fwd": 0.1}))
    assert store.steps() == [197, 198, 199]
    rows = [json.loads(line) for line in file.rows(None, None, None)]
    saved = len(rows)
    assert 0 < saved < 200 and [r["step"] for r in rows] == list(range(saved))  # from the first step on
    assert file.status()["capped"] and file.not_saved == 200 - saved and file.bytes <= 20_000
    assert [r["step"] for r in map(json.loads, file.rows(5, 7, {1}))] == [5]  # steps 5..7, rank 1 only
    file.close()


def test_gantt_tracks_are_numbered_in_rank_order_whatever_order_spans_arrive_in(tmp_path) -> None:
    rows = []
    for rank in (3, 0, 2, 1):
        for role in ("trainer", "generator"):
            rows.append(
                {
                    "name": "s",
                    "start_ns": 1000,
                    "end_ns": 2000,
                    "rank": rank,
                    "role": role,
                    "process": f"{role}_r{rank}",
                }
            )
    out = tmp_path / "trace.json"
    perfetto.write(rows, out)
    names = {
        e["args"]["name"]: e["pid"] for e in json.loads(out.read_text())["traceEvents"] if e["name"] == "process_name"
    }
    assert sorted(names, key=names.__getitem__) == [f"trainer_r{r}" for r in range(4)] + [
        f"generator_r{r}" for r in range(4)
    ]


def test_a_span_file_cut_mid_line_by_a_crash_goes_on_on_a_new_line(tmp_path) -> None:
    path = tmp_path / "x" / "spans.jsonl"
    path.parent.mkdir()
    path.write_text('{"name": "whole", "step": 0, "rank": 0}\n{"name": "cut", "st')
    file = SpanFile(path, max_bytes=1 << 20)
    store = TraceStore(file=file)
    store.ingest(process(1), scope_spans(1, {"after": 0.1}))
    assert [json.loads(line)["name"] for line in file.rows(None, None, None)] == ["whole", "after"]
    assert [json.loads(line)["name"] for line in file.rows(1, 1, None)] == ["after"]
    file.close()


def test_span_links_become_perfetto_flow_arrows_from_each_linked_span_whichever_comes_first(tmp_path) -> None:
    """A trainer step linked to two generations (``rs.rl.consume``): one arrow from each
    generation's track to the trainer's, also when the linking span is read first."""

    def span(name: str, span_id: str, role: str, rank: int, start: int, links: tuple[str, ...] = ()) -> dict:
        return {
            "name": name,
            "span_id": span_id,
            "start_ns": start,
            "end_ns": start + 1000,
            "rank": rank,
            "role": role,
            "process": f"{role}_r{rank}",
            "links": [{"trace_id": "1" * 32, "span_id": s} for s in links],
        }

    generations = [span("generate", f"{i:016x}", "generator", i, 1000 * i) for i in (1, 2)]
    train = span("train_step", "f" * 16, "trainer", 0, 5000, tuple(f"{i:016x}" for i in (1, 2, 9)))
    for order in ([*generations, train], [train, *generations]):
        out = tmp_path / "trace.json"
        writer = perfetto.write(order, out)
        events = json.loads(out.read_text())["traceEvents"]
        pids = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
        starts = {e["id"]: e for e in events if e.get("cat") == "lineage" and e["ph"] == "s"}
        ends = {e["id"]: e for e in events if e.get("cat") == "lineage" and e["ph"] == "f"}
        assert writer.links == 2 and starts.keys() == ends.keys()  # the link to an unknown span draws nothing
        assert sorted(starts[i]["pid"] for i in starts) == [pids["generator_r1"], pids["generator_r2"]]
        assert {ends[i]["pid"] for i in ends} == {pids["trainer_r0"]} and {ends[i]["ts"] for i in ends} == {5.0}


def test_span_text_and_attributes_are_bounded_and_printable() -> None:
    from rankscope.sink.testing import Limits, check_span, span_attributes, span_text

    assert check_span(trace_pb2.Span(name="x", trace_id=b"\x01" * 16, span_id=b"\x02" * 8)) is None
    for ids in ({"trace_id": b"\x01" * 15, "span_id": b"\x02" * 8}, {"trace_id": b"\x01" * 16, "span_id": b""}):
        assert "malformed" in (check_span(trace_pb2.Span(name="x", **ids)) or "")
    for ids in ({"trace_id": b"\x00" * 16, "span_id": b"\x02" * 8}, {"trace_id": b"\x01" * 16, "span_id": b"\x00" * 8}):
        assert "all-zero" in (check_span(trace_pb2.Span(name="x", **ids)) or "")
    backwards = trace_pb2.Span(
        name="x", trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=10, end_time_unix_nano=9
    )
    assert "ends before it starts" in (check_span(backwards) or "")
    assert span_text("fwd", 255) == "fwd" and span_text("", 255) == ""
    assert span_text("x" * 300, 255) == "x" * 254 + "\u2026"
    assert span_text("a\nb\x1b[0m\u202e c", 255) == "a\ufffdb\ufffd[0m\ufffd c"
    limits = Limits(max_span_attribute_chars=100)
    kvs = [key_value("k\n", "bad key"), key_value("a", "v" * 60), key_value("b", 7), key_value("c", "w" * 60)]
    kept, left_out = span_attributes(kvs, limits)
    assert kept == {"a": "v" * 60, "b": 7} and left_out == 2  # the bad key, and what did not fit
