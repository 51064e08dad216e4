"""A shared sink that no client can take down, lock out or hijack (issue 40): scopes and runs.

Each test runs a real sink with scoped tokens (``edge.auth.load_tokens``, from a TOML file) and
an honest 2-rank experiment finalizing meanwhile (``tests/victim.py``: its steps within a
bound, its values exact), and attacks over real OTLP/HTTP and OTLP/gRPC:

* another scope's hijacks (``resume=latest`` under the victim's experiment, the victim's run id
  with attempt 99, a fake goodbye, data for an experiment outside the token's) are refused,
  counted, and the victim's run is untouched;
* within one scope, ``resume=latest`` leaves a run that is still sending alone (a new run, said
  in ``run_notes``);
* 800 resumes at once over both transports answer no 5xx and no internal error, and the run's
  record on disk keeps every launch;
* a finished run refuses every later point alike (the same instance id, another rank, a later
  step), and its own scope's requeue opens it again;
* a run's first step of 10^18 is refused and its honest steps are not late;
* a non-UTF-8 ``Authorization`` is 401 on HTTP and UNAUTHENTICATED on gRPC;
* a resume whose attempt would pass 2^31-1 is refused with a reason.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value
from rankscope.sink import BookConfig, Sink, Transport
from rankscope.sink.testing import load_tokens

from ..raw_h2 import grpc_call
from ..victim import Victim

pytestmark = pytest.mark.timeout(120)

VICTIMS = "victims-token-0123456789"
ATTACKERS = "attackers-token-0123456789"
OUTSIDERS = "outsiders-token-0123456789"
TOKENS = f"""
# Two teams whose experiments overlap ("victim"), and one that writes elsewhere only.
[scopes.victims]
tokens = ["{VICTIMS}"]
experiments = ["victim", "victims-*"]

[scopes.attackers]
tokens = ["{ATTACKERS}"]
experiments = ["victim", "victims-*"]

[scopes.outsiders]
token = "{OUTSIDERS}"
experiments = ["elsewhere-*"]
"""
GRACE = 1.0
"""The sinks' grace: how long a step waits for its last process, and a run for late joiners after its last goodbye."""
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


@pytest.fixture
def sink(make_sink: Any, tmp_path: Path) -> Sink:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    started: Sink = make_sink(
        state_dir=tmp_path / "state", transport=Transport(tokens=load_tokens(tokens)), book=BookConfig(grace=GRACE)
    )
    return started


@pytest.fixture
def victim(sink: Sink, request: pytest.FixtureRequest) -> Iterator[Victim]:
    """The victims' 2-rank run ``victim-run`` of experiment ``victim``, steps under way: over the
    test's ``transport`` (OTLP/HTTP where it has none)."""
    params = getattr(request.node, "callspec", None)
    grpc_port = sink.grpc_port if params is not None and params.params.get("transport") == "grpc" else None
    with Victim(sink.http_port, grpc_port=grpc_port, token=VICTIMS) as running:
        wait_for(lambda: len(running.latencies) >= 3, what="the victim's first steps")
        yield running


def wait_for(done: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.05)


def request(
    experiment: str,
    run: str,
    *,
    instance: str,
    rank: int = 0,
    world: int = 2,
    step: int | None = 0,
    attempt: int | None = None,
    resume: str | None = None,
    goodbye: bool = False,
) -> mpb.ExportMetricsServiceRequest:
    """One process's export: ``loss`` (MEAN) and its flush marker at ``step``, and/or its goodbye."""
    resource: dict[str, Any] = {
        attr.EXPERIMENT_ID: experiment,
        attr.RUN_ID: run,
        attr.SERVICE_INSTANCE_ID: instance,
        attr.RANK: str(rank),
        attr.WORLD_SIZE: str(world),
        attr.ROLE: "trainer",
    }
    if attempt is not None:
        resource[attr.EXPERIMENT_ATTEMPT] = attempt
    if resume is not None:
        resource[attr.RUN_RESUME] = resume
    r = mpb.ExportMetricsServiceRequest()
    metrics = r.resource_metrics.add(resource=encode_resource(resource)).scope_metrics.add().metrics
    if step is not None:
        point = metrics.add(name="loss").histogram.data_points.add(count=1, sum=float(step + rank), bucket_counts=[1])
        point.attributes.extend([key_value(attr.REDUCE, "mean"), key_value(attr.STEP, step)])
        marker = metrics.add(name=attr.FLUSH_MARKER)
        marker.sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, step)])
    if goodbye:
        metrics.add(name=attr.GOODBYE).sum.data_points.add(as_int=1)
    return r


class Sender:
    """An OTLP client of the sink over one transport with one token (None: none)."""

    def __init__(self, sink: Sink, transport: str, token: str | None) -> None:
        self.sink, self.transport, self.token = sink, transport, token
        self._channel = grpc.insecure_channel(f"127.0.0.1:{sink.grpc_port}") if transport == "grpc" else None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def send(self, r: mpb.ExportMetricsServiceRequest) -> tuple[int, str]:
        """(rejected data points, message) of an answered export; raises on an HTTP or gRPC error."""
        if self._channel is not None:
            metadata = [("authorization", f"Bearer {self.token}")] if self.token else None
            answer = mgrpc.MetricsServiceStub(self._channel).Export(r, timeout=30, metadata=metadata)
        else:
            status, body = http_post(self.sink.http_port, "/v1/metrics", r.SerializeToString(), self.token)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
            answer = mpb.ExportMetricsServiceResponse.FromString(body)
        return answer.partial_success.rejected_data_points, answer.partial_success.error_message


def http_post(port: int, path: str, body: bytes, token: str | None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/x-protobuf", **({"Authorization": f"Bearer {token}"} if token else {})}
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def http_get(port: int, path: str, query: dict[str, str], token: str | None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", f"{path}?{urllib.parse.urlencode(query)}", headers=headers)
        response = conn.getresponse()
        body = response.read()
        return response.status, json.loads(body) if response.status == 200 else body
    finally:
        conn.close()


@pytest.fixture(params=["http", "grpc"])
def transport(request: pytest.FixtureRequest) -> str:
    found: str = request.param
    return found


def test_another_scopes_hijacks_are_refused_counted_and_the_victims_run_untouched(
    sink: Sink, victim: Victim, transport: str
) -> None:
    attacker, outsider = Sender(sink, transport, ATTACKERS), Sender(sink, transport, OUTSIDERS)
    try:
        took = attacker.send(request("victim", "evil-1", instance="evil-1-r0", resume="latest"))
        assert took[0] == 2 and "runs of experiment 'victim' are another token scope's" in took[1], took
        restarted = attacker.send(request("victim", "victim-run", instance="evil-r0", attempt=99))
        assert restarted[0] == 2 and "belongs to another token scope" in restarted[1], restarted
        named = attacker.send(request("victim", "evil-2", instance="evil-2-r0", resume="victim-run"))
        assert named[0] == 2 and "belongs to another token scope" in named[1], named
        for rank in range(2):  # a fake goodbye in each of the victim's processes' names
            bye = attacker.send(
                request("victim", "victim-run", instance=f"victim-victim-run-r{rank}", step=None, goodbye=True)
            )
            assert bye[0] == 1 and "belongs to another token scope" in bye[1], bye
        elsewhere = outsider.send(request("victim", "victim-run", instance="out-r0"))
        assert elsewhere[0] == 2 and "not among those of this token's scope 'outsiders'" in elsewhere[1], elsewhere
        anonymous = Sender(sink, transport, None)  # no token at all
        try:
            if transport == "http":
                with pytest.raises(RuntimeError, match="HTTP 401"):
                    anonymous.send(request("victim", "victim-run", instance="anon-r0"))
            else:
                with pytest.raises(grpc.RpcError) as refused:
                    anonymous.send(request("victim", "victim-run", instance="anon-r0"))
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            anonymous.close()
        steps = len(victim.latencies)
        wait_for(lambda: len(victim.latencies) >= steps + 5, what="the victim's steps after the attacks")
    finally:
        attacker.close()
        outsider.close()
    victim.stop()
    victim.check(min_steps=8, within=2.0)

    status = sink.status("victim", "victim-run")
    assert status is not None and status["run"] == "victim-run" and status["attempt"] == 0
    assert (status["abandoned_steps"], status["superseded_points"], status["reused_run_points"]) == (0, 0, 0)
    assert status["scope_refused_points"] == 2 + 2 + 1 + 1  # attempt 99, the named resume, two goodbyes
    assert [(r["run"], r["scope"], r["ended"]) for r in status["runs"]] == [("victim-run", "victims", False)]
    overview = sink.overview()
    assert overview["refused_points"] >= 10 and sink.internal_errors == []
    assert any("another token scope" in kind for kind in overview["refusals"]), overview["refusals"]


def test_a_scoped_token_reads_and_configures_only_its_own_experiments(sink: Sink, victim: Victim) -> None:
    port = sink.http_port
    assert port is not None
    mine = http_get(port, "/rankscope/v1/status", {"experiment": "victim"}, VICTIMS)
    assert mine[0] == 200 and mine[1]["run"] == "victim-run"
    assert http_get(port, "/rankscope/v1/status", {"experiment": "victim"}, OUTSIDERS)[0] == 404
    assert http_get(port, "/rankscope/v1/recent", {"experiment": "victim"}, OUTSIDERS)[0] == 404
    listed = http_get(port, "/rankscope/v1/status", {}, OUTSIDERS)
    assert listed[0] == 200 and listed[1]["experiment_list"] == []
    posted = json.dumps({"experiment": "victim", "backends": {"console": {}}}).encode()
    status, body = http_post(port, "/rankscope/v1/config", posted, OUTSIDERS)
    assert status == 200 and json.loads(body)["result"].startswith("refused: scope 'outsiders' may not write")
    victim.stop()
    victim.check(min_steps=3, within=2.0)


def test_resume_latest_within_a_scope_leaves_a_run_that_is_still_sending_alone(
    sink: Sink, victim: Victim, transport: str
) -> None:
    teammate = Sender(sink, transport, VICTIMS)
    try:
        assert teammate.send(request("victim", "relaunch-1", instance="relaunch-r0", resume="latest")) == (0, "")
        steps = len(victim.latencies)
        wait_for(lambda: len(victim.latencies) >= steps + 3, what="the victim's steps after the resume")
    finally:
        teammate.close()
    victim.stop()
    victim.check(min_steps=6, within=2.0)
    relaunch = sink.status("victim", "relaunch-1")
    assert relaunch is not None and (relaunch["run"], relaunch["attempt"]) == ("relaunch-1", 0)
    live = sink.status("victim", "victim-run")
    assert live is not None and (live["attempt"], live["superseded_points"], live["abandoned_steps"]) == (0, 0, 0)
    notes = sink.overview()["run_notes"]
    assert any("'victim-run' of experiment 'victim' is still sending" in str(n) for n in notes), notes


def test_800_concurrent_resumes_over_http_and_grpc_answer_no_5xx_and_keep_every_launch(
    sink: Sink, victim: Victim, tmp_path: Path
) -> None:
    senders = {kind: Sender(sink, kind, VICTIMS) for kind in ("http", "grpc")}
    failures: list[str] = []
    lock = threading.Lock()

    def launch(i: int) -> None:
        kind = "http" if i % 2 else "grpc"
        try:
            _, message = senders[kind].send(
                request("victims-resumes", f"launch-{i:03d}", instance=f"launch-{i:03d}-r0", resume="base", step=i)
            )
            if "internal error" in message:
                raise RuntimeError(message)
        except (RuntimeError, OSError, grpc.RpcError) as exc:
            with lock:
                failures.append(f"{kind} launch {i}: {exc}"[:300])

    try:
        assert senders["http"].send(request("victims-resumes", "base", instance="base-r0")) == (0, "")
        with ThreadPoolExecutor(max_workers=32) as pool:
            list(pool.map(launch, range(800)))
    finally:
        for sender in senders.values():
            sender.close()
    victim.stop()
    assert failures == [], failures[:5]
    victim.check(min_steps=3, within=5.0)
    status = sink.status("victims-resumes", "base")
    assert status is not None and status["attempt"] == 800 and status["internal_errors"] == 0
    (meta,) = [
        json.loads(p.read_text())
        for p in (tmp_path / "state").rglob("meta.json")
        if json.loads(p.read_text()).get("run") == "base"
    ]
    assert len(meta["launches"]) == 800 and sorted(meta["launches"].values()) == list(range(1, 801))
    assert meta["owner"] == "victims"


def test_a_finished_run_refuses_every_later_point_alike(sink: Sink, victim: Victim, transport: str) -> None:
    team = Sender(sink, transport, VICTIMS)
    try:
        for step in range(3):
            for rank in range(2):
                assert (
                    team.send(request("victims-done", "job-7", instance=f"job-7-r{rank}", rank=rank, step=step))[0] == 0
                )
        for rank in range(2):
            assert (
                team.send(request("victims-done", "job-7", instance=f"job-7-r{rank}", step=None, goodbye=True))[0] == 0
            )
        wait_for(lambda: (sink.status("victims-done", "job-7") or {}).get("last_finalized_step") == 2, what="job-7")
        time.sleep(GRACE + 0.5)  # past the grace after the last goodbye: finished
        later = [
            request("victims-done", "job-7", instance="job-7-r0", step=3),  # the same instance id
            request("victims-done", "job-7", instance="job-7-r5", rank=5, world=8, step=1),  # another rank
            request("victims-done", "job-7", instance="job-7-new", step=50),  # a later step
            request("victims-done", "job-7", instance="job-7-r1", step=None, goodbye=True),  # a goodbye again
        ]
        answers = [team.send(r) for r in later]
        assert [n for n, _ in answers] == [2, 2, 2, 1], answers
        assert len({message for _, message in answers}) == 1  # refused the same way
        assert "run 'job-7' ended (every process said goodbye)" in answers[0][1]
        status = sink.status("victims-done", "job-7")
        assert status is not None and status["reused_run_points"] == 7 and status["late_points"] == 0
        assert status["last_finalized_step"] == 2 and status["runs"][0]["ended"] is True
        requeued = request("victims-done", "job-7", instance="job-7-requeued", step=1, attempt=10_000)
        assert team.send(requeued) == (0, "")  # its own scope's requeue continues it
    finally:
        team.close()
    victim.stop()
    victim.check(min_steps=3, within=2.0)


def test_a_first_step_of_10_18_is_refused_and_the_runs_honest_steps_are_not_late(
    sink: Sink, victim: Victim, transport: str
) -> None:
    team = Sender(sink, transport, VICTIMS)
    try:
        far = team.send(request("victims-far", "far", instance="far-x", step=10**18))
        assert far[0] == 2 and "step 1000000000000000000 is more than 1000000 ahead of 0" in far[1], far
        for step in range(2):
            for rank in range(2):
                assert team.send(request("victims-far", "far", instance=f"far-r{rank}", rank=rank, step=step)) == (
                    0,
                    "",
                )
        wait_for(lambda: (sink.status("victims-far", "far") or {}).get("last_finalized_step") == 1, what="far")
    finally:
        team.close()
    status = sink.status("victims-far", "far")
    assert status is not None and status["late_points"] == 0 and status["points"] == 4
    victim.stop()
    victim.check(min_steps=3, within=2.0)


def test_a_non_utf8_authorization_is_401_on_http_and_unauthenticated_on_grpc(sink: Sink, victim: Victim) -> None:
    assert sink.http_port is not None and sink.grpc_port is not None
    body = request("victim", "victim-run", instance="bytes-r0").SerializeToString()
    for path in ("/v1/metrics", "/rankscope/v1/status?experiment=victim"):
        with socket.create_connection(("127.0.0.1", sink.http_port), timeout=10) as raw:
            raw.sendall(
                f"POST {path} HTTP/1.1\r\nHost: sink\r\nContent-Type: application/x-protobuf\r\n".encode()
                + b"Authorization: Bearer \xff\xfe\xc3(\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    for sent in (b"Bearer \xff\xfe\xc3(", b"Bearer " + VICTIMS.encode() + b"\xff"):
        found = grpc_call(sink.grpc_port, EXPORT, sent, body)
        assert found.get(b"grpc-status") == b"16" and found.get(b"grpc-message") == b"missing or wrong bearer token"
    honest = request("victims-bytes", "b", instance="bytes-r0").SerializeToString()
    assert grpc_call(sink.grpc_port, EXPORT, f"Bearer {VICTIMS}".encode(), honest).get(b"grpc-status") == b"0"
    victim.stop()
    victim.check(min_steps=3, within=2.0)
    assert sink.internal_errors == []


def test_a_resume_whose_attempt_would_pass_2_31_minus_1_is_refused(sink: Sink, victim: Victim, transport: str) -> None:
    team = Sender(sink, transport, VICTIMS)
    try:
        assert team.send(request("victims-max", "ovf", instance="ovf-r0", attempt=2**31 - 2)) == (0, "")
        answers = [
            team.send(request("victims-max", f"again-{i}", instance=f"again-{i}", resume="ovf")) for i in range(3)
        ]
    finally:
        team.close()
    assert answers[0] == (0, "")
    for rejected, message in answers[1:]:
        assert rejected == 2 and "run 'ovf' is at attempt 2147483647; one more would pass 2147483647" in message
    status = sink.status("victims-max", "ovf")
    assert status is not None and status["attempt"] == 2**31 - 1
    victim.stop()
    victim.check(min_steps=3, within=2.0)


def test_a_runs_scope_and_its_end_survive_a_sink_restart(make_sink: Any, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    config = {
        "transport": Transport(tokens=load_tokens(tokens)),
        "book": BookConfig(grace=GRACE),
        "state_dir": tmp_path / "state",
    }
    first: Sink = make_sink(**config)
    team = Sender(first, "http", VICTIMS)
    for rank in range(2):
        assert team.send(request("victims-kept", "kept", instance=f"kept-r{rank}", rank=rank, goodbye=True)) == (0, "")
    team.close()
    wait_for(lambda: (first.status("victims-kept", "kept") or {}).get("last_finalized_step") == 0, what="kept")
    time.sleep(GRACE + 0.5)  # finished before the restart
    first.stop()
    again: Sink = make_sink(**config)
    with Victim(again.http_port, grpc_port=again.grpc_port, token=VICTIMS) as victim:
        wait_for(lambda: len(victim.latencies) >= 3, what="the victim's first steps")
        attacker, team = Sender(again, "grpc", ATTACKERS), Sender(again, "grpc", VICTIMS)
        try:
            hijack = attacker.send(request("victims-kept", "x", instance="x-r0", resume="kept"))
            assert hijack[0] == 2 and "belongs to another token scope" in hijack[1], hijack
            reused = team.send(request("victims-kept", "kept", instance="kept-r9", rank=1, step=5))
            assert reused[0] == 2 and "run 'kept' ended (every process said goodbye)" in reused[1], reused
            assert team.send(request("victims-kept", "y", instance="y-r0", resume="kept")) == (0, "")  # its own
        finally:
            attacker.close()
            team.close()
    victim.check(min_steps=3, within=2.0)
    status = again.status("victims-kept", "kept")
    assert status is not None and status["attempt"] == 1 and status["runs"][0]["scope"] == "victims"
