"""A shared sink no client can starve with cheap requests that cost much: a real ``rankscope sink``,
attacked over real OTLP/HTTP and OTLP/gRPC, while an honest 2-rank experiment (``tests/victim.py``)
keeps finalizing with exact values.

- 2,000,000 empty points in one 4 MB request took 10.6 s (HTTP) / 5.2 s (gRPC) and 200 MB, all of
  them taken as plain points; eight such clients drove the sink to 3.7 GB. Now the body is walked
  before it is decoded and refused at ``max_points`` (``otlp.raw.walk_metrics``): 400
  (INVALID_ARGUMENT) with the reason, in a fraction of a second, the sink's memory unmoved.
- One 3.5 MB request naming 20,000 experiments kept opening runs for five minutes after its client
  gave up (21,211 runs). Now a request is refused whole past ``max_resources`` or
  ``max_experiments`` before any run opens, opens at most ``max_new_runs`` runs (the rest waits for
  the client's retry, which the sink knows by its digests: nothing is merged twice), and stops
  opening runs once its client went away.
- The same 20,000 experiments sent to /v1/traces or /v1/logs opened runs until the client's quota was
  full (511 runs) and kept its client waiting past 30 s. Traces and logs requests are now walked and
  bounded alike (``max_records``: spans or log records of one request), answered in 0.05 s with no
  run opened; and since spans and log records have no digest to know a retry by, such a request
  opens all its runs before it takes any of it (nothing taken when answered 429).
- Eight clients each sending 1,048,575 empty points (just under ``max_points``) at once took 28 s an
  answer and 1.9 GB; the victim's steps came at a tenth of their pace, three finalized without a
  rank. Now the sink weighs each request's points before decoding it and takes at most
  ``max_points_in_flight`` (2,097,152) of the large ones at once, answering the others retry-later:
  peak 580 MB, the victim's steps on time and exact.

The counting walk and each bound without sockets: ``tests/unit/test_sink_request_cost.py``.
"""

from __future__ import annotations

import http.client
import json
import math
import sys
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.metrics.v1 import metrics_pb2 as mpb

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value
from rankscope.sink import Limits

from ..conftest import free_port
from ..pipeline import Process, clean_env, wait_http
from ..victim import Victim
from ..wire import field as _field

EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
ROUTES = {
    "metrics": ("/v1/metrics", EXPORT),
    "traces": ("/v1/traces", "/opentelemetry.proto.collector.trace.v1.TraceService/Export"),
    "logs": ("/v1/logs", "/opentelemetry.proto.collector.logs.v1.LogsService/Export"),
}
MB = 1 << 20


def empty_points(n: int) -> bytes:
    """One Gauge of ``n`` empty points: two bytes each, a plain OTel point each to a sink that takes them."""
    resource = encode_resource({attr.EXPERIMENT_ID: "cheap-points", attr.SERVICE_INSTANCE_ID: "p"})
    metric = _field(1, b"noise") + _field(5, b"\x0a\x00" * n)
    return _field(1, _field(1, resource.SerializeToString()) + _field(2, _field(2, metric)))


def step_zero(experiments: list[str]) -> bytes:
    """Each experiment's one process (a run of its own) sends step 0: ``loss``, a SUM of 1.0, and
    its flush marker. Merged twice, a run would say 2.0."""
    template = mpb.ResourceMetrics()
    metrics = template.scope_metrics.add().metrics
    point = metrics.add(name="loss").sum.data_points.add(as_double=1.0)
    point.attributes.extend([key_value(attr.REDUCE, "sum"), key_value(attr.STEP, 0)])
    metrics.add(name=attr.FLUSH_MARKER).sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, 0)])
    scopes = template.SerializeToString()
    parts = []
    for e in experiments:
        resource = {attr.EXPERIMENT_ID: e, attr.RUN_ID: f"{e}-run", attr.SERVICE_INSTANCE_ID: f"{e}-r0"}
        resource.update({attr.RANK: "0", attr.WORLD_SIZE: "1"})
        parts.append(_field(1, _field(1, encode_resource(resource).SerializeToString()) + scopes))
    return b"".join(parts)


def rss_mb(pid: int) -> float:
    """The process's resident set (``/proc/PID/status``, VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Peak(threading.Thread):
    """A process's resident set sampled every 20 ms: the most seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak = pid, rss_mb(pid)
        self._halt = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._halt.wait(0.02):
            self.peak = max(self.peak, rss_mb(self.pid))

    def stop(self) -> float:
        self._halt.set()
        self.join(5)
        return self.peak


def start_sink(tmp: Path) -> tuple[Process, int, int]:
    """``rankscope sink`` as its own process, with its default bounds and a write-ahead log."""
    grpc_port, http_port = free_port(), free_port()
    views = {"jsonl": {"logging_mode": "global_reduce", "path": str(tmp / "views" / "{experiment}.jsonl")}}
    command = [sys.executable, "-m", "rankscope.cli", "sink", "--grpc-port", str(grpc_port)]
    command += ["--http-port", str(http_port), "--backends", json.dumps(views), "--grace", "5"]
    command += ["--state-dir", str(tmp / "state")]
    process = Process(command, clean_env(), tmp / "sink.log")
    wait_http(f"http://127.0.0.1:{http_port}/healthz", proc=process)
    return process, grpc_port, http_port


class Answer:
    """An export's answer on either transport: its status (HTTP status, or gRPC code name), the
    message, the retry hint in seconds (``Retry-After``, ``RetryInfo``) and how long it took."""

    def __init__(self, status: int | str, message: str, retry_after: float | None, took: float) -> None:
        self.status, self.message, self.retry_after, self.took = status, message, retry_after, took

    def __repr__(self) -> str:
        return f"Answer({self.status!r}, {self.message[:120]!r}, retry {self.retry_after}, {self.took:.2f} s)"


def send(
    body: bytes, via: str, http_port: int, grpc_port: int, timeout: float = 60.0, signal: str = "metrics"
) -> Answer:
    started = time.monotonic()
    path, method = ROUTES[signal]
    if via == "grpc":
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", 64 * MB)]) as ch:
            try:
                ch.unary_unary(method)(body, timeout=timeout)
                return Answer("OK", "", None, time.monotonic() - started)
            except grpc.RpcError as exc:
                hint = dict(exc.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")  # type: ignore[attr-defined]
                delay = RetryInfo.FromString(hint).retry_delay.seconds if hint else None
                return Answer(exc.code().name, exc.details() or "", delay, time.monotonic() - started)  # type: ignore[attr-defined]
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/x-protobuf"})
        try:
            response = conn.getresponse()
        except TimeoutError:  # the client gives up: its connection closes
            return Answer(0, "timed out", None, time.monotonic() - started)
        payload = response.read()
        message = Status.FromString(payload).message if response.status != 200 else ""
        after = response.getheader("Retry-After")
        return Answer(response.status, message, float(after) if after else None, time.monotonic() - started)
    finally:
        conn.close()


def overview(http_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/rankscope/v1/status", timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def recent(http_port: int, experiment: str, run: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"experiment": experiment, "run": run})
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/rankscope/v1/recent?{query}", timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def _kind(status: dict[str, Any], words: str) -> int:
    """Points the status route counts under the kind of refusal whose text holds ``words``."""
    return sum(count for kind, count in status["refusals"].items() if words in kind)


@pytest.mark.timeout(240)
def test_cheap_requests_that_cost_much_are_refused_in_a_moment_and_the_sink_keeps_its_memory(tmp_path: Path) -> None:
    """2,000,000 empty points (4 MB), 20,000 experiments (3.9 MB: past ``max_resources``) and 2,000
    experiments (past ``max_experiments``), each twice over HTTP and over gRPC, and the points from
    six clients at once: every one answered 400/INVALID_ARGUMENT with the reason within seconds,
    the sink's resident set within 150 MB of where it was, no run opened, every refusal counted."""
    sink, grpc_port, http_port = start_sink(tmp_path)
    try:
        pid = sink.proc.pid
        points = empty_points(2_000_000)
        many = step_zero([f"named-{i}" for i in range(20_000)])
        some = step_zero([f"some-{i}" for i in range(2_000)])
        assert len(points) > 4_000_000 and len(many) > 3_500_000
        with Victim(http_port, grpc_port=grpc_port, interval=0.1) as victim:
            time.sleep(1.0)  # a few honest steps first
            runs = overview(http_port)["runs"]
            before = rss_mb(pid)
            peak = Peak(pid)
            answers: list[tuple[str, str, Answer]] = []
            for body, bound in ((points, "max_points"), (many, "max_resources"), (some, "max_experiments")):
                for via in ("http", "grpc", "http", "grpc"):
                    answers.append((via, bound, send(body, via, http_port, grpc_port)))
            with ThreadPoolExecutor(6) as pool:  # six clients at once, three rounds each
                crowd = list(pool.map(lambda i: send(points, ("http", "grpc")[i % 2], http_port, grpc_port), range(18)))
            answers += [(("http", "grpc")[i % 2], "max_points", a) for i, a in enumerate(crowd)]
            most = peak.stop()
            time.sleep(1.0)
            after = rss_mb(pid)
            status = overview(http_port)
        victim.check(min_steps=5, within=3.0)

        for via, bound, answer in answers:
            assert answer.status == (400 if via == "http" else "INVALID_ARGUMENT"), (via, bound, answer)
            assert f"(limit {bound})" in answer.message and "not taken" in answer.message, answer
            assert answer.retry_after is None, answer  # sent again it is refused again
            assert answer.took < 10.0, answer  # measured: 0.2 s (was 10.6 s and 5.2 s for the points)
        assert most - before < 150, f"resident set {before:.0f} MiB before, {most:.0f} at most"
        assert status["runs"] == runs, status["runs"]  # no run opened for any of it
        assert status["experiment_list"] and {e["id"] for e in status["experiment_list"]} == {"victim"}
        assert _kind(status, "(limit max_points)") >= 22 * ((1 << 20) + 1)
        assert _kind(status, "(limit max_resources)") >= 4 * 16_384
        assert _kind(status, "(limit max_experiments)") >= 4 * 2_000
        slowest = max(a.took for _, _, a in answers)
        print(
            f"\n{len(answers)} costly requests refused, slowest in {slowest:.2f} s; resident set {before:.0f} MiB "
            f"before, {most:.0f} at most, {after:.0f} after; victim's slowest step {max(victim.latencies):.2f} s"
        )
    finally:
        sink.stop()
    assert "Traceback" not in sink.text(), sink.text()[-3000:]


@pytest.mark.timeout(240)
def test_a_request_opening_more_runs_than_the_bound_is_taken_whole_by_its_retries_and_merged_once(
    tmp_path: Path,
) -> None:
    """200 new runs in one request, over each transport: an attempt opens at most ``max_new_runs``
    (128) and is answered 429/RESOURCE_EXHAUSTED with a retry hint of 1 s; the client's retry opens
    the rest; every run then holds its step exactly once (a SUM of 1.0, not 2.0: the part taken
    before is known by its digest), and the victim never noticed. (400 runs: one client may hold
    512 open, ``RunLimits.per_client``.)"""
    sink, grpc_port, http_port = start_sink(tmp_path)
    limit = Limits().max_new_runs
    try:
        with Victim(http_port, grpc_port=grpc_port, interval=0.1) as victim:
            time.sleep(0.5)
            for via in ("http", "grpc"):
                experiments = [f"{via}-burst-{i}" for i in range(200)]
                body = step_zero(experiments)
                attempts: list[Answer] = []
                while not attempts or attempts[-1].status not in (200, "OK"):
                    assert len(attempts) <= math.ceil(200 / limit), attempts
                    opened = overview(http_port)["runs"]
                    attempts.append(send(body, via, http_port, grpc_port))
                    assert overview(http_port)["runs"] <= opened + limit  # the run count never grows past the bound
                    if attempts[-1].status not in (200, "OK"):
                        answer = attempts[-1]
                        assert answer.status == (429 if via == "http" else "RESOURCE_EXHAUSTED"), answer
                        assert "(limit max_new_runs)" in answer.message and answer.retry_after == 1, answer
                        time.sleep(answer.retry_after)  # as OTLP exporters do
                assert len(attempts) == math.ceil(200 / limit)

                def finalized(experiment: str) -> list[dict[str, Any]]:
                    deadline = time.monotonic() + 30
                    while not (steps := recent(http_port, experiment, f"{experiment}-run")):
                        assert time.monotonic() < deadline, f"{experiment} not finalized"
                        time.sleep(0.1)
                    return steps

                for experiment in experiments[::20]:  # runs of every attempt
                    steps = finalized(experiment)
                    assert [(s["step"], s["values"].get("loss")) for s in steps] == [(0, 1.0)], (experiment, steps)
            status = overview(http_port)
        victim.check(min_steps=10, within=3.0)
        assert status["runs"] == 401, status["runs"]  # 400 and the victim's
        assert _kind(status, "(limit max_new_runs)") > 0  # the waits, counted in the status route
    finally:
        sink.stop()
    assert "Traceback" not in sink.text(), sink.text()[-3000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("via", ["http", "grpc"])
def test_a_request_stops_opening_runs_once_its_client_went_away(make_sink: Any, tmp_path: Path, via: str) -> None:
    """With the bounds raised out of the way, a request naming 3,000 new runs takes seconds; its
    client gives up after half a second, and the sink opens no run after noticing (it went on for
    five minutes): the run count stops far below 3,000, and what was not taken is counted."""
    limits = Limits(max_new_runs=100_000, max_experiments=100_000)
    views = {"jsonl": {"logging_mode": "global_reduce", "path": str(tmp_path / "views" / "{experiment}.jsonl")}}
    sink = make_sink(limits=limits, backends=views, state_dir=tmp_path / "state")
    body = step_zero([f"gone-{i}" for i in range(3_000)])
    answer = send(body, via, sink.http_port, sink.grpc_port, timeout=0.5)
    assert answer.status in ("DEADLINE_EXCEEDED", 0), answer
    time.sleep(1.0)  # the request notices at its next run
    counts = [sink.overview()["runs"]]
    for _ in range(3):
        time.sleep(0.5)
        counts.append(sink.overview()["runs"])
    assert counts[0] == counts[-1] < 3_000, counts
    refusals = sink.overview()["refusals"]
    assert sum(n for kind, n in refusals.items() if "went away" in kind) == 2 * (3_000 - counts[-1]), refusals
    print(f"\nclient gone after 0.5 s ({via}): {counts[-1]} of 3,000 runs opened, then none")


def one_record(signal: str, experiments: list[str]) -> bytes:
    """Each experiment's one process (a run of its own) sends one span (log record)."""
    if signal == "traces":
        record = (
            _field(1, b"\1" * 16) + _field(2, b"\2" * 8) + _field(5, b"forward") + b"\x41" + (1).to_bytes(8, "little")
        )
    else:
        record = b"\x09" + (1).to_bytes(8, "little") + _field(5, _field(1, b"a line"))
    parts = []
    for e in experiments:
        resource = {attr.EXPERIMENT_ID: e, attr.RUN_ID: f"{e}-run", attr.SERVICE_INSTANCE_ID: f"{e}-r0"}
        resource.update({attr.RANK: "0", attr.WORLD_SIZE: "1"})
        parts.append(_field(1, _field(1, encode_resource(resource).SerializeToString()) + _field(2, _field(2, record))))
    return b"".join(parts)


def empty_records(n: int) -> bytes:
    """One scope of ``n`` empty spans (log records: the same bytes), two bytes each."""
    resource = encode_resource({attr.EXPERIMENT_ID: "cheap-records", attr.SERVICE_INSTANCE_ID: "p"})
    return _field(1, _field(1, resource.SerializeToString()) + _field(2, b"\x12\x00" * n))


def run_status(http_port: int, experiment: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"experiment": experiment, "run": f"{experiment}-run"})
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/rankscope/v1/status?{query}", timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


@pytest.mark.timeout(240)
def test_traces_and_logs_requests_that_cost_much_are_refused_in_a_moment_and_open_no_run(tmp_path: Path) -> None:
    """20,000 experiments (past ``max_resources``: they opened 511 runs and held their client past
    30 s), 2,000 experiments (past ``max_experiments``) and 2,000,000 empty spans or log records
    (past ``max_records``), to /v1/traces and /v1/logs over HTTP and gRPC: each answered
    400/INVALID_ARGUMENT with the reason within seconds, no run opened, the sink's memory unmoved,
    the victim on time."""
    sink, grpc_port, http_port = start_sink(tmp_path)
    try:
        pid = sink.proc.pid
        cheap = empty_records(2_000_000)
        with Victim(http_port, grpc_port=grpc_port, interval=0.1) as victim:
            time.sleep(1.0)
            runs, before = overview(http_port)["runs"], rss_mb(pid)
            peak = Peak(pid)
            answers: list[tuple[str, str, Answer]] = []
            for signal in ("traces", "logs"):
                many = one_record(signal, [f"{signal}-named-{i}" for i in range(20_000)])
                some = one_record(signal, [f"{signal}-some-{i}" for i in range(2_000)])
                for body, bound in ((many, "max_resources"), (some, "max_experiments"), (cheap, "max_records")):
                    for via in ("http", "grpc"):
                        answers.append((via, bound, send(body, via, http_port, grpc_port, signal=signal)))
            most = peak.stop()
            status = overview(http_port)
        victim.check(min_steps=5, within=3.0)
        for via, bound, answer in answers:
            assert answer.status == (400 if via == "http" else "INVALID_ARGUMENT"), (via, bound, answer)
            assert f"(limit {bound})" in answer.message and "not taken" in answer.message, answer
            assert answer.retry_after is None and answer.took < 10.0, answer  # measured: 0.05 s
        assert status["runs"] == runs, status["runs"]  # none opened (was 511, then the client's quota)
        assert {e["id"] for e in status["experiment_list"]} == {"victim"}
        assert most - before < 150, f"resident set {before:.0f} MiB before, {most:.0f} at most"
        assert _kind(status, "(limit max_records)") >= 4 * ((1 << 16) + 1)
        slowest = max(a.took for _, _, a in answers)
        print(f"\n{len(answers)} traces and logs requests refused, slowest in {slowest:.2f} s, no run opened")
    finally:
        sink.stop()
    assert "Traceback" not in sink.text(), sink.text()[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("via", ["http", "grpc"])
def test_a_traces_or_logs_request_opening_more_runs_than_the_bound_is_taken_once_by_its_retry(
    tmp_path: Path, via: str
) -> None:
    """200 new runs in one traces request and in one logs request: the first attempt opens 128 runs
    and takes nothing (429/RESOURCE_EXHAUSTED, retry in 1 s: spans and log records have no digest,
    so a partial take would be taken twice by the retry), the retry opens the rest and takes the
    request whole: every run holds its span (log record) exactly once; the victim never noticed."""
    sink, grpc_port, http_port = start_sink(tmp_path)
    limit = Limits().max_new_runs
    try:
        with Victim(http_port, grpc_port=grpc_port, interval=0.1) as victim:
            time.sleep(0.5)
            for signal, taken in (("traces", "spans_stored"), ("logs", "log_records")):
                experiments = [f"{via}-{signal}-{i}" for i in range(200)]
                body, opened = one_record(signal, experiments), overview(http_port)["runs"]
                first = send(body, via, http_port, grpc_port, signal=signal)
                assert first.status == (429 if via == "http" else "RESOURCE_EXHAUSTED"), first
                assert "(limit max_new_runs); nothing taken" in first.message and first.retry_after == 1, first
                assert overview(http_port)["runs"] == opened + limit
                assert {run_status(http_port, e)[taken] for e in experiments[:limit]} == {0}  # opened, nothing taken
                time.sleep(first.retry_after)
                second = send(body, via, http_port, grpc_port, signal=signal)
                assert second.status in (200, "OK"), second
                assert [run_status(http_port, e)[taken] for e in experiments] == [1] * 200
            status = overview(http_port)
        victim.check(min_steps=10, within=3.0)
        assert status["runs"] == 401, status["runs"]  # 400 and the victim's
    finally:
        sink.stop()
    assert "Traceback" not in sink.text(), sink.text()[-3000:]


def retried(
    body: bytes, via: str, http_port: int, grpc_port: int, patience: float = 150.0
) -> tuple[list[Answer], float]:
    """Sent until answered other than retry-later (429, RESOURCE_EXHAUSTED), waiting each retry
    hint out as OTLP exporters do: every answer, and the seconds until the last."""
    started = time.monotonic()
    answers = [send(body, via, http_port, grpc_port, timeout=patience)]
    while answers[-1].status in (429, "RESOURCE_EXHAUSTED") and time.monotonic() - started < patience:
        time.sleep(answers[-1].retry_after or 1.0)
        answers.append(send(body, via, http_port, grpc_port, timeout=patience))
    return answers, time.monotonic() - started


@pytest.mark.timeout(300)
def test_clients_sending_near_bound_requests_at_once_leave_the_victim_on_time_and_the_sink_its_memory(
    tmp_path: Path,
) -> None:
    """Eight clients each send 1,048,575 empty points (one under ``max_points``) at once, half over
    HTTP, half over gRPC, retrying as told. They took 28 s an answer, the sink 1.9 GB, and the
    victim's steps a second each, three finalized without a rank. Now the sink takes at most
    ``max_points_in_flight`` (2,097,152: two of them) at once and answers the others 429 with a
    retry hint before decoding them: every request is taken in the end, the sink's resident set
    stays within 1 GB of where it was (measured 515 MB), the victim's steps are on time and exact."""
    sink, grpc_port, http_port = start_sink(tmp_path)
    try:
        pid = sink.proc.pid
        body = empty_points((1 << 20) - 1)
        with Victim(http_port, grpc_port=grpc_port, interval=0.1) as victim:
            time.sleep(1.0)
            before = rss_mb(pid)
            peak = Peak(pid)
            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                sent = list(pool.map(lambda i: retried(body, ("http", "grpc")[i % 2], http_port, grpc_port), range(8)))
            wall = time.monotonic() - started
            most = peak.stop()
            status = overview(http_port)
        victim.check(min_steps=5, within=3.0)
        tries, took = [answers for answers, _ in sent], [seconds for _, seconds in sent]
        for i, answers in enumerate(tries):
            assert answers[-1].status == (200, "OK")[i % 2], answers[-1]
            for answer in answers[:-1]:
                assert "(limit max_points_in_flight); retry" in answer.message and answer.retry_after == 1, answer
        assert sum(len(answers) > 1 for answers in tries) >= 4  # at most two taken at once: the rest waited
        assert most - before < 1024, f"resident set {before:.0f} MiB before, {most:.0f} at most"
        assert _kind(status, "(limit max_points_in_flight)") > 0  # counted in the status route
        print(
            f"\n8 near-bound clients: all taken in {wall:.1f} s (each in {min(took):.1f} to {max(took):.1f} s, "
            f"{sum(map(len, tries)) - 8} retries); resident set {before:.0f} MiB before, {most:.0f} at most; "
            f"victim's slowest step {max(victim.latencies):.2f} s over {len(victim.latencies)} steps"
        )
    finally:
        sink.stop()
    assert "Traceback" not in sink.text(), sink.text()[-3000:]
