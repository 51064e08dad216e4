"""An honest experiment that keeps finalizing while a test attacks the sink.

``Victim`` is a thread that plays a 2-rank job over real OTLP (HTTP or gRPC) against a sink on
loopback: each step, both ranks send their values and the flush marker, and the victim reads the
finalized step back from the sink's control route (``/rankscope/v1/recent``, so it works against
an in-process sink and a ``rankscope sink`` subprocess alike). It keeps, per step, how long the
step took from its last report to its view, and whether the view's values are exactly what the
two ranks sent. A test starts it, attacks, stops it and asserts with ``check``:

    with Victim(sink.http_port) as victim:
        flood(...)
    victim.check(min_steps=5, within=2.0)
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value

RANKS = 2


def step_request(experiment: str, run: str, rank: int, step: int) -> mpb.ExportMetricsServiceRequest:
    """Rank ``rank``'s values of ``step`` (``loss``: MEAN of step + rank, ``top``: MAX) and its flush marker."""
    r = mpb.ExportMetricsServiceRequest()
    resource = {
        attr.EXPERIMENT_ID: experiment,
        attr.RUN_ID: run,
        attr.SERVICE_INSTANCE_ID: f"{experiment}-{run}-r{rank}",
        attr.RANK: str(rank),
        attr.WORLD_SIZE: str(RANKS),
        attr.ROLE: "trainer",
    }
    rm = r.resource_metrics.add(resource=encode_resource(resource))
    metrics = rm.scope_metrics.add().metrics
    for key, reduce in (("loss", "mean"), ("top", "max")):
        m = metrics.add(name=key)
        value = float(step + rank)
        if reduce == "mean":
            point = m.histogram.data_points.add(count=1, sum=value, bucket_counts=[1])
        else:
            point = m.gauge.data_points.add(as_double=value)
        point.attributes.extend([key_value(attr.REDUCE, reduce), key_value(attr.STEP, step)])
    marker = metrics.add(name=attr.FLUSH_MARKER)
    marker.sum.data_points.add(as_int=2, attributes=[key_value(attr.STEP, step)])
    return r


def expected(step: int) -> dict[str, float]:
    return {"loss": step + (RANKS - 1) / 2, "top": float(step + RANKS - 1)}


class Victim(threading.Thread):
    """A 2-rank experiment reporting a step every ``interval`` seconds until ``stop``."""

    def __init__(
        self,
        http_port: int,
        *,
        grpc_port: int | None = None,
        experiment: str = "victim",
        run: str = "victim-run",
        interval: float = 0.1,
        token: str | None = None,
        patience: float = 30.0,
        grace: float | None = None,
    ) -> None:
        super().__init__(name=f"victim-{experiment}", daemon=True)
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.experiment = experiment
        self.run_id = run
        self.interval = interval
        self.token = token
        self.patience = patience
        self.grace = grace
        """The sink's grace, where a test set it short: a step whose rank-1 send the victim's own
        thread began more than that after rank 0's was answered may be finalized without rank 1, and
        must then be made exact by the sink's late update (``slow_sends``). The sink's own slowness
        is never excused: the gap excludes both answers. None: any step finalized inexact is wrong."""
        self.slow_sends: list[str] = []
        """Steps the victim's own thread was late for (behind the GIL of a test's attacker threads),
        finalized partial, then corrected exactly; ``check`` allows a quarter of the steps at most."""
        self.latencies: list[float] = []
        """Per finalized step: seconds from its last rank's report to its view at the sink."""
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.retries = 0
        """Exports retried (a connection lost or refused, UNAVAILABLE): an OTLP exporter's retries."""
        self._halt = threading.Event()

    def __enter__(self) -> Victim:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._halt.set()
        self.join(self.patience + 10)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _request(self, rank: int, step: int) -> mpb.ExportMetricsServiceRequest:
        """Rank ``rank``'s request of ``step`` (the victim's own work before a send)."""
        return step_request(self.experiment, self.run_id, rank, step)

    def _send(self, conn: http.client.HTTPConnection, stub: Any, r: mpb.ExportMetricsServiceRequest) -> None:
        """One export, retried as OTLP exporters retry: a connection lost or refused, a gRPC
        UNAVAILABLE (the sink deduplicates a retry, so the step stays exact), within ``patience``;
        each retry counted (``retries``), the step's latency bound still asserted."""
        deadline, pause = time.monotonic() + self.patience, 0.05
        while True:
            try:
                return self._send_once(conn, stub, r)
            except (OSError, http.client.HTTPException, grpc.RpcError) as exc:
                retryable = not isinstance(exc, grpc.RpcError) or exc.code() == grpc.StatusCode.UNAVAILABLE
                if not retryable or time.monotonic() + pause > deadline:
                    raise
                self.retries += 1
                conn.close()
                time.sleep(pause)
                pause = min(2 * pause, 0.5)

    def _send_once(self, conn: http.client.HTTPConnection, stub: Any, r: mpb.ExportMetricsServiceRequest) -> None:
        if stub is not None:
            metadata = [("authorization", f"Bearer {self.token}")] if self.token else None
            answer = stub.Export(r, timeout=self.patience, metadata=metadata)
        else:
            headers = {"Content-Type": "application/x-protobuf", **self._headers()}
            conn.request("POST", "/v1/metrics", body=r.SerializeToString(), headers=headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
            answer = mpb.ExportMetricsServiceResponse.FromString(body)
        if answer.partial_success.rejected_data_points:
            raise RuntimeError(f"refused: {answer.partial_success.error_message}")

    def _recent(self, conn: http.client.HTTPConnection) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"experiment": self.experiment, "run": self.run_id})
        conn.request("GET", f"/rankscope/v1/recent?{query}", headers=self._headers())
        response = conn.getresponse()
        body = response.read()
        return json.loads(body) if response.status == 200 else []

    def run(self) -> None:
        send = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=self.patience)
        read = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=self.patience)
        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") if self.grpc_port else None
        stub = mgrpc.MetricsServiceStub(channel) if channel is not None else None
        step = 0
        try:
            while not self._halt.is_set():
                try:
                    gap, answered = 0.0, None
                    for rank in range(RANKS):
                        request = self._request(rank, step)
                        if answered is not None:
                            gap = max(gap, time.monotonic() - answered)
                        self._send(send, stub, request)
                        answered = time.monotonic()
                    sent = time.monotonic()
                    self._await(read, step, sent, gap)
                except (OSError, http.client.HTTPException, grpc.RpcError, RuntimeError, ValueError) as exc:
                    self.errors.append(f"step {step}: {type(exc).__name__}: {exc}"[:300])
                    send.close()
                    read.close()
                    if len(self.errors) > 50:
                        return
                step += 1
                self._halt.wait(self.interval)
        finally:
            send.close()
            read.close()
            if channel is not None:
                channel.close()

    def _await(self, read: http.client.HTTPConnection, step: int, sent: float, gap: float) -> None:
        """Wait for ``step``'s view; ``gap``: the victim's own longest pause between one rank's answer
        and the next rank's send (the sink's answers not in it)."""
        while time.monotonic() - sent < self.patience:
            found = next((s for s in self._recent(read) if s["step"] == step), None)
            if found is not None:
                self.latencies.append(time.monotonic() - sent)
                values = {k: found["values"].get(k) for k in expected(step)}
                if values == expected(step):
                    return
                missing = found["missing"]
                said = f"step {step}: {values} != {expected(step)} (missing {missing}, own gap {gap:.2f} s)"
                if self.grace is not None and missing and gap > self.grace:
                    self._await_correction(read, step, sent, said)
                else:
                    self.wrong.append(said)
                return
            time.sleep(0.02)
        self.errors.append(f"step {step} not finalized within {self.patience:g} s")

    def _await_correction(self, read: http.client.HTTPConnection, step: int, sent: float, said: str) -> None:
        """A step the victim itself delivered slower than the grace: its late update must make it exact."""
        while time.monotonic() - sent < self.patience:
            found = next((s for s in self._recent(read) if s["step"] == step), None)
            if found is not None and {k: found["values"].get(k) for k in expected(step)} == expected(step):
                self.slow_sends.append(said)
                return
            time.sleep(0.02)
        self.wrong.append(f"{said}, not corrected within {self.patience:g} s")

    def check(self, *, min_steps: int, within: float) -> None:
        """The victim finalized at least ``min_steps`` steps, each within ``within`` seconds of its
        last report, with exactly the values its ranks sent, and no request of it failed."""
        assert self.errors == [], self.errors[:5]
        assert self.wrong == [], (self.wrong[:5], self.slow_sends[:5])
        assert len(self.slow_sends) <= len(self.latencies) // 4, self.slow_sends[:5]
        assert len(self.latencies) >= min_steps, f"{len(self.latencies)} steps finalized"
        assert max(self.latencies) <= within, f"slowest step {max(self.latencies):.2f} s (bound {within:g} s)"
