"""A shared sink that no client can take down, lock out, hijack or read (issues 40 and 49): scopes and runs.

Each test runs a real sink with scoped tokens (``edge.auth.load_tokens``, from a TOML file) and
an honest 2-rank experiment finalizing meanwhile (``tests/victim.py``: its values exact), and
attacks over real OTLP/HTTP and OTLP/gRPC. Scopes never share an experiment, so the only other
scope that can send to a scope's experiment is the sink's all-experiments ``--token``:

* the all-experiments token's hijacks (``resume=latest`` under the victim's experiment, the
  victim's run id with attempt 99, a fake goodbye) and a neighbour scope's data for the victim's
  experiment are refused, counted, and the victim's run is untouched;
* within one scope, ``resume=latest`` leaves a run that is still sending alone (a new run, said
  in ``run_notes``);
* 800 resumes at once over both transports answer no 5xx and no internal error, and the run's
  record on disk keeps every launch;
* a finished run refuses every later point alike (the same instance id, another rank, a later
  step), and its own scope's requeue opens it again;
* a run's first step of 10^18 is refused and its honest steps are not late;
* a non-UTF-8 ``Authorization`` is 401 on HTTP and UNAUTHENTICATED on gRPC;
* a resume whose attempt would pass 2^31-1 is refused with a reason.

Against a ``rankscope sink`` subprocess (issue 49): a tokens file whose scopes can share an
experiment (``shared-*`` twice, ``team-a*`` without its separator) keeps the sink from starting,
the reason on stderr; and a prefix scope (``team-a-*``) can neither read, write, capture, post views
for nor take run ids of its neighbours (``team-ab-*``, the exact ``team-a``), nor find their names
in its overview, while the neighbour's experiment finalizes its exact values.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
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
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value
from rankscope.sink import BookConfig, Sink, Transport
from rankscope.sink.testing import load_tokens

from ..conftest import free_port
from ..pipeline import Process, clean_env, wait_http
from ..raw_h2 import grpc_call
from ..victim import Victim

pytestmark = pytest.mark.timeout(120)

VICTIMS = "victims-token-0123456789"
ATTACKERS = "attackers-token-0123456789"
OUTSIDERS = "outsiders-token-0123456789"
ADMIN = "admins-token-0123456789"
"""The sink's ``--token``: every experiment, as the all-experiments scope (no run of a named scope is its)."""
TOKENS = f"""
# The victims; their closest neighbour ("victim-*" takes neither "victim" nor "victims-x"); and
# a team that writes elsewhere only. No experiment is two scopes'.
[scopes.victims]
tokens = ["{VICTIMS}"]
experiments = ["victim", "victims-*"]

[scopes.attackers]
tokens = ["{ATTACKERS}"]
experiments = ["victim-*"]

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
        state_dir=tmp_path / "state",
        transport=Transport(token=ADMIN, tokens=load_tokens(tokens)),
        book=BookConfig(grace=GRACE),
    )
    return started


@pytest.fixture
def victim(sink: Sink, request: pytest.FixtureRequest) -> Iterator[Victim]:
    """The victims' 2-rank run ``victim-run`` of experiment ``victim``, steps under way: over the
    test's ``transport`` (OTLP/HTTP where it has none)."""
    params = getattr(request.node, "callspec", None)
    grpc_port = sink.grpc_port if params is not None and params.params.get("transport") == "grpc" else None
    with Victim(sink.http_port, grpc_port=grpc_port, token=VICTIMS, grace=GRACE) as running:
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
    admin, attacker = Sender(sink, transport, ADMIN), Sender(sink, transport, ATTACKERS)
    outsider = Sender(sink, transport, OUTSIDERS)
    try:  # the all-experiments token may send to the victims' experiment, never to their run
        took = admin.send(request("victim", "evil-1", instance="evil-1-r0", resume="latest"))
        assert took[0] == 2 and "runs of experiment 'victim' are another token scope's" in took[1], took
        restarted = admin.send(request("victim", "victim-run", instance="evil-r0", attempt=99))
        assert restarted[0] == 2 and "belongs to another token scope" in restarted[1], restarted
        named = admin.send(request("victim", "evil-2", instance="evil-2-r0", resume="victim-run"))
        assert named[0] == 2 and "belongs to another token scope" in named[1], named
        for rank in range(2):  # a fake goodbye in each of the victim's processes' names
            bye = admin.send(
                request("victim", "victim-run", instance=f"victim-victim-run-r{rank}", step=None, goodbye=True)
            )
            assert bye[0] == 1 and "belongs to another token scope" in bye[1], bye
        for sender, name in ((attacker, "attackers"), (outsider, "outsiders")):  # scopes: not even the experiment
            for r in (
                request("victim", "victim-run", instance="out-r0"),
                request("victim", "evil-3", instance="evil-3-r0", resume="latest"),
            ):
                elsewhere = sender.send(r)
                assert elsewhere[0] == 2 and f"not among those of this token's scope '{name}'" in elsewhere[1]
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
        for sender in (admin, attacker, outsider):
            sender.close()
    victim.stop()
    victim.check(min_steps=8, within=2.0)

    status = sink.status("victim", "victim-run")
    assert status is not None and status["run"] == "victim-run" and status["attempt"] == 0
    assert (status["abandoned_steps"], status["superseded_points"], status["reused_run_points"]) == (0, 0, 0)
    assert status["scope_refused_points"] == 2 + 2 + 1 + 1  # attempt 99, the named resume, two goodbyes
    assert [(r["run"], r["scope"], r["ended"]) for r in status["runs"]] == [("victim-run", "victims", False)]
    overview = sink.overview()
    assert overview["refused_points"] >= 16 and sink.internal_errors == []
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
            request("victims-done", "job-7", instance="job-7-r1", rank=1, step=None, goodbye=True),  # a new goodbye
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
        "transport": Transport(token=ADMIN, tokens=load_tokens(tokens)),
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
    with Victim(again.http_port, grpc_port=again.grpc_port, token=VICTIMS, grace=GRACE) as victim:
        wait_for(lambda: len(victim.latencies) >= 3, what="the victim's first steps")
        attacker, team = Sender(again, "grpc", ADMIN), Sender(again, "grpc", VICTIMS)
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


# -- a `rankscope sink` subprocess: scopes that share nothing (issue 49) --------------------------

ALPHA = "alpha-token-0123456789"
ALPHABET = "alphabet-token-0123456789"
BARE = "bare-alpha-token-0123456789"
NEIGHBOURS = f"""
# team-a-* beside its neighbours: team-ab-* and the exact team-a (no experiment is two scopes')
[scopes.alpha]
token = "{ALPHA}"
experiments = ["team-a-*"]

[scopes.alphabet]
token = "{ALPHABET}"
experiments = ["team-ab-*"]

[scopes.bare-alpha]
token = "{BARE}"
experiments = ["team-a"]
"""
OVERLAPPING = {
    "shared": (
        '[scopes.first]\ntoken = "first-token-0123456789"\nexperiments = ["mine", "shared-*"]\n'
        '[scopes.second]\ntoken = "second-token-0123456789"\nexperiments = ["shared-*"]\n',
        "scope 'first' and scope 'second' overlap: 'shared-*' and 'shared-*' both match experiment 'shared-'",
    ),
    "unseparated": (
        '[scopes.a]\ntoken = "first-token-0123456789"\nexperiments = ["team-a*"]\n'
        '[scopes.ab]\ntoken = "second-token-0123456789"\nexperiments = ["team-ab-*"]\n',
        "scope 'a': prefix 'team-a*' has no separator before its '*'",
    ),
}


def sink_command(tokens: Path, grpc_port: int, http_port: int) -> list[str]:
    """``rankscope sink`` with scoped tokens and the all-experiments ``--token``, views posted by
    the experiments (no ``--backends``), no write-ahead log."""
    command = [sys.executable, "-m", "rankscope.cli", "sink", "--tokens", str(tokens), "--token", ADMIN]
    return [*command, "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--no-state-dir", "--grace", "1"]


def test_a_tokens_file_whose_scopes_share_an_experiment_keeps_the_sink_from_starting(tmp_path: Path) -> None:
    for name, (text, reason) in OVERLAPPING.items():
        tokens = tmp_path / f"{name}.toml"
        tokens.write_text(text)
        tokens.chmod(0o600)
        http_port = free_port()
        ran = subprocess.run(
            sink_command(tokens, free_port(), http_port),
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert ran.returncode == 2, (name, ran.returncode, ran.stderr[-2000:])
        assert f"rankscope sink: {tokens}: {reason}" in ran.stderr, (name, ran.stderr[-2000:])
        with socket.socket() as s:  # it never listened
            s.bind(("127.0.0.1", http_port))


@pytest.fixture
def neighbours(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A ``rankscope sink`` subprocess serving ``NEIGHBOURS``: its (gRPC, HTTP) ports."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(NEIGHBOURS)
    tokens.chmod(0o600)
    grpc_port, http_port = free_port(), free_port()
    process = Process(sink_command(tokens, grpc_port, http_port), clean_env(), tmp_path / "sink.log")
    try:
        wait_http(f"http://127.0.0.1:{http_port}/healthz", proc=process)
        yield grpc_port, http_port
    finally:
        process.stop()


class TokenClient:
    """One token's OTLP and control clients of a ``rankscope sink`` subprocess."""

    def __init__(self, ports: tuple[int, int], token: str) -> None:
        self.grpc_port, self.http_port = ports
        self.token = token

    def send(self, r: mpb.ExportMetricsServiceRequest, transport: str) -> tuple[int, str]:
        """(rejected data points, message) of an answered export over ``transport``."""
        if transport == "grpc":
            with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
                metadata = [("authorization", f"Bearer {self.token}")]
                answer = mgrpc.MetricsServiceStub(channel).Export(r, timeout=30, metadata=metadata)
        else:
            status, body = http_post(self.http_port, "/v1/metrics", r.SerializeToString(), self.token)
            assert status == 200, (status, body[:300])
            answer = mpb.ExportMetricsServiceResponse.FromString(body)
        return answer.partial_success.rejected_data_points, answer.partial_success.error_message

    def span(self, experiment: str) -> tuple[int, str]:
        """(rejected spans, message) of one span of ``experiment`` sent over OTLP/HTTP."""
        r = tpb.ExportTraceServiceRequest()
        resource = {attr.EXPERIMENT_ID: experiment, attr.RUN_ID: "victim-run", attr.SERVICE_INSTANCE_ID: "spy-r0"}
        spans = r.resource_spans.add(resource=encode_resource(resource)).scope_spans.add().spans
        spans.add(name="step", trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=1, end_time_unix_nano=2)
        status, body = http_post(self.http_port, "/v1/traces", r.SerializeToString(), self.token)
        assert status == 200, (status, body[:300])
        answer = tpb.ExportTraceServiceResponse.FromString(body)
        return answer.partial_success.rejected_spans, answer.partial_success.error_message

    def get(self, path: str, **query: str) -> tuple[int, Any]:
        return http_get(self.http_port, path, query, self.token)

    def post(self, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        status, body = http_post(self.http_port, path, json.dumps(payload).encode(), self.token)
        return status, json.loads(body) if status == 200 else body


def test_a_prefix_scope_cannot_reach_its_neighbours_nor_find_their_names(neighbours: tuple[int, int]) -> None:
    alpha, alphabet, bare = (TokenClient(neighbours, token) for token in (ALPHA, ALPHABET, BARE))
    admin = TokenClient(neighbours, ADMIN)
    theirs = ("team-ab-victim", "team-a")  # a neighbour by prefix, and the exact id its prefix's stem names
    grpc_port, http_port = neighbours
    with Victim(http_port, grpc_port=grpc_port, experiment="team-ab-victim", token=ALPHABET, grace=GRACE) as victim:
        wait_for(lambda: len(victim.latencies) >= 3, what="the neighbour's first steps")
        for transport in ("http", "grpc"):  # write: its data, and a guessable run id taken first
            for experiment in theirs:
                for r in (
                    request(experiment, "victim-run", instance="spy-r0", step=1),
                    request(experiment, "job-1", instance="job-1-r0"),
                    request(experiment, "job-2", instance="job-2-r0", resume="latest"),
                ):
                    rejected, message = alpha.send(r, transport)
                    assert rejected == 2 and "not among those of this token's scope 'alpha'" in message, message
        assert alpha.span("team-ab-victim")[0] == 1 and alpha.span("team-a")[0] == 1
        assert alphabet.send(request("team-ab-jobs", "job-1", instance="job-1-r0"), "grpc") == (0, "")
        assert bare.send(request("team-a", "job-1", instance="job-1-r0"), "http") == (0, "")
        assert alphabet.send(request("team-a-x", "x", instance="x-r0"), "http")[0] == 2  # and the other way round
        for experiment in (*theirs, "team-ab-jobs"):  # read: as if there were no such experiment
            for path in ("/rankscope/v1/status", "/rankscope/v1/recent", "/rankscope/v1/spans"):
                code, body = alpha.get(path, experiment=experiment)
                assert code == 404 and f"no experiment {experiment!r}".encode() in body, (path, code, body[:200])
        process = "team-ab-victim-victim-run-r0"  # the victim's rank 0 (``tests/victim.py``)
        assert alpha.post("/rankscope/v1/captures", {"experiment": "team-ab-victim"})[0] == 404
        assert alpha.get("/rankscope/v1/captures", experiment="team-ab-victim", process=process) == (200, [])
        assert alpha.post("/rankscope/v1/report", {"experiment": "team-ab-victim"})[0] == 404
        asked = alphabet.post("/rankscope/v1/captures", {"experiment": "team-ab-victim", "reason": "own"})
        assert asked[0] == 200, asked  # the neighbour's rate limit was not spent by the refused ask
        pending = alphabet.get("/rankscope/v1/captures", experiment="team-ab-victim", process=process)
        assert pending[0] == 200 and [c["id"] for c in pending[1]] == [asked[1]["id"]]  # nor taken by its poll
        views = {"console": {"logging_mode": "global_reduce"}}
        for experiment, owner in (("team-ab-views", alphabet), ("team-a", bare)):  # views: posted first, refused
            refused = alpha.post("/rankscope/v1/config", {"experiment": experiment, "backends": views})
            assert refused == (200, {"result": f"refused: scope 'alpha' may not write experiment {experiment!r}"})
            assert owner.post("/rankscope/v1/config", {"experiment": experiment, "backends": views}) == (
                200,
                {"result": "ok"},
            )
        # run notes of each scope: a resume that found nothing to continue names its experiment
        assert alpha.send(request("team-a-notes", "n-1", instance="n-1-r0", resume="latest"), "http") == (0, "")
        assert alphabet.send(request("team-ab-notes", "n-1", instance="n-1-r0", resume="latest"), "http") == (0, "")
        steps = len(victim.latencies)
        wait_for(lambda: len(victim.latencies) >= steps + 5, what="the neighbour's steps after the attempts")
        mine, everything = alpha.get("/rankscope/v1/status"), admin.get("/rankscope/v1/status")
        jobs = alphabet.get("/rankscope/v1/status", experiment="team-ab-jobs")
    victim.check(min_steps=8, within=10.0)
    assert mine[0] == 200 and everything[0] == 200
    said = json.dumps(mine[1])
    for name in ("team-ab", '"team-a"', "'team-a'", "alphabet", "bare-alpha", "victim", "job-"):
        assert name not in said, (name, mine[1])
    assert mine[1]["scope"] == "alpha" and [e["id"] for e in mine[1]["experiment_list"]] == ["team-a-notes"]
    assert [n for n in mine[1]["run_notes"] if "team-a-notes" in n] == mine[1]["run_notes"] != []
    assert "refusals" not in mine[1] and "descriptors" not in mine[1]  # the sink-wide counts are the --token's
    assert any("team-ab-notes" in n for n in everything[1]["run_notes"]) and everything[1]["refused_points"] >= 26
    assert jobs[0] == 200 and [(r["run"], r["scope"]) for r in jobs[1]["runs"]] == [("job-1", "alphabet")]
