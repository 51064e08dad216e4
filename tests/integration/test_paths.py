"""Names never become paths: hostile experiment ids, roles and replicas stay inside the configured directories.

A real sink on loopback is sent such names over OTLP/HTTP and OTLP/gRPC and every file it
creates is checked (the mapping itself is ``tests/unit/test_paths.py``). A shared sink also holds
the view paths its clients post to its working directory; a job's own sink takes them as given.
"""

from __future__ import annotations

import http.client
import json
import os
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from rankscope.core import names as attr
from rankscope.metrics.recorder import Recorder
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.metrics import PointAttributes, encode
from rankscope.sink import BookConfig

from ..hostile_names import assert_contained, hostile_jobs

# -- the mapping, as a pure function ------------------------------------------------------------------


def metrics_request(resource: dict[str, Any], step: int = 0) -> mpb.ExportMetricsServiceRequest:
    c = Recorder(streams=[])
    c.record("loss", 1.5, Reduce.MEAN)
    request = mpb.ExportMetricsServiceRequest()
    rm = request.resource_metrics.add(resource=encode_resource(resource))
    scope = rm.scope_metrics.add()
    metric = encode("loss", c.accs["loss"], step, 0, 1, PointAttributes())
    assert metric is not None
    marker = pb.Metric(name=attr.FLUSH_MARKER)
    marker.sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, step)])
    scope.metrics.extend([metric, marker])
    return request


def send(sink: Any, request: mpb.ExportMetricsServiceRequest, via_http: bool) -> int:
    """Post over OTLP/HTTP or OTLP/gRPC; the number of points the sink refused (with a reason)."""
    if via_http:
        conn = http.client.HTTPConnection("127.0.0.1", sink.http_port, timeout=10)
        try:
            conn.request("POST", "/v1/metrics", request.SerializeToString(), {"Content-Type": "application/x-protobuf"})
            response = conn.getresponse()
            body = response.read()
            assert response.status == 200, (response.status, body)
        finally:
            conn.close()
        answer = mpb.ExportMetricsServiceResponse.FromString(body)
    else:
        with grpc.insecure_channel(sink.endpoint) as channel:
            answer = mgrpc.MetricsServiceStub(channel).Export(request, timeout=10)
    refused = answer.partial_success.rejected_data_points
    assert not refused or answer.partial_success.error_message
    return refused


@pytest.mark.timeout(180)
def test_path_hostile_ids_and_roles_create_files_only_under_the_configured_directories(
    make_sink, tmp_path: Path, monkeypatch
) -> None:
    cwd, views = tmp_path / "cwd", tmp_path / "views"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # the relative default rankscope_logs/... lands here
    monkeypatch.setenv("WANDB_MODE", "offline")
    before_parent = set(os.listdir(tmp_path.parent))
    tag = uuid.uuid4().hex
    backends = {
        "jsonl": {"logging_mode": "global_reduce", "path": str(views / "jsonl" / "{experiment}" / "{process}.jsonl")},
        "per_rank": {"backend": "jsonl", "logging_mode": "per_rank_reduce"},  # default path, relative to cwd
        "tensorboard": {"logging_mode": "global_reduce", "logdir": str(views / "tb")},
        "tb_rank": {"backend": "tensorboard", "logging_mode": "per_rank_reduce", "logdir": str(views / "tb")},
    }
    wandb_view = {"wandb": {"logging_mode": "global_reduce", "dir": str(views / "wandb")}}
    sink = make_sink(backends=backends, book=BookConfig(grace=30))
    wandb_sink = make_sink(backends=wandb_view, book=BookConfig(grace=30))  # W&B runs are slow to open: a few ids only

    jobs = [*hostile_jobs(tag), ("plain-exp", "trainer", None)]
    accepted = []
    for i, (experiment, role, replica) in enumerate(jobs):
        resource: dict[str, Any] = {
            attr.EXPERIMENT_ID: experiment,
            attr.SERVICE_INSTANCE_ID: f"p{i}",
            attr.ROLE: role,
            attr.RANK: "0",
            attr.WORLD_SIZE: "1",
            attr.EXPERIMENT_ATTEMPT: 0,
        }
        if replica is not None:
            resource[attr.REPLICA] = replica
        # Refusing a name at the edge is fine (answered and counted); accepting it must give a safe path.
        if send(sink, metrics_request(resource), via_http=i % 2 == 0) == 0:
            accepted.append((experiment, role, replica))
        if i < 3:
            send(wandb_sink, metrics_request(resource), via_http=False)
    for experiment, _, _ in accepted:
        sink.finalize(experiment)
    sink.finalize()
    wandb_sink.finalize()
    sink.stop()
    wandb_sink.stop()

    assert not Path(f"/tmp/abs-{tag}").exists() and not Path(f"/tmp/escape-{tag}").exists()
    assert not Path(f"/tmp/abs-role-{tag}").exists()
    created = assert_contained(
        tmp_path, [views / "jsonl", views / "tb", views / "wandb", cwd / "rankscope_logs"], before_parent
    )
    assert set(os.listdir(cwd)) == {"rankscope_logs"}

    # The original names stay in the data, and one file never mixes two experiments.
    assert ("plain-exp", "trainer", None) in accepted and len(accepted) >= 3
    assert (cwd / "rankscope_logs" / "plain-exp" / "global.jsonl").is_file()
    assert (views / "tb" / "plain-exp" / "trainer_r0").is_dir() and (views / "tb" / "plain-exp" / "global").is_dir()
    global_rows: dict[str, list[dict[str, Any]]] = {}
    rank_rows: dict[str, list[dict[str, Any]]] = {}
    for path in created:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            assert len({row["experiment"] for row in rows}) == 1, path
            target = rank_rows if (cwd / "rankscope_logs") in path.parents else global_rows
            assert target.setdefault(rows[0]["experiment"], rows) is rows, f"two files for {rows[0]['experiment']!r}"
    for experiment, role, replica in accepted:
        assert any(r.get("key") == "loss" and r["value"] == 1.5 for r in global_rows[experiment]), experiment
        row = next(r for r in rank_rows[experiment] if r["key"] == "loss")
        assert (row["role"], row.get("replica")) == (role, replica)
    assert len([p for p in created if p.name.startswith("run-") and p.suffix == ".wandb"]) >= 1


def test_a_shared_sink_holds_posted_view_paths_to_its_working_directory(make_sink, tmp_path: Path) -> None:
    """A client's posted config chooses views, not where on the sink's disk they write; the sink of
    one job (embedded, ``rankscope run``) takes its own job's paths as given."""
    from rankscope.export.senders import post_config

    shared = make_sink()
    control = f"http://127.0.0.1:{shared.http_port}"
    for options, why in (
        ({"path": "/etc/cron.d/x"}, "relative path without '..'"),
        ({"path": "logs/../../x.jsonl"}, "relative path without '..'"),
        ({"logdir": "~/x"}, "relative path without '..'"),
        ({"dir": 7}, "must be a non-empty string"),
        ({"path": "x/{experiment.__class__}.jsonl"}, "may only use"),
        ({"path": "x/{0}.jsonl"}, "may only use"),
        ({"path": "x/{experiment"}, "not a format string"),
        ({"path": "{experiment:.>2.0}/x.jsonl"}, "may only use"),  # fill + precision 0: '..'
        ({"path": "{experiment:/>1.0}tmp/x.jsonl"}, "may only use"),  # ... or '/': absolute
        ({"path": "x/{rank:>4000000000}.jsonl"}, "may only use"),  # a 4 GB name
        ({"path": "x/{experiment:{experiment.__class__}}"}, "may only use"),  # a lookup inside the spec
        ({"path": "x/{experiment!r}.jsonl"}, "may only use"),
        ({"path": "javascript:void(0)-{run}.html"}, "plain relative path"),  # a scheme in the pages' links
        ({"path": "logs\\x.jsonl"}, "plain relative path"),
        ({"logdir": "tb/{run}"}, "plain directory"),  # TensorBoard's logdir is not formatted: a literal {run}
    ):
        answer = post_config(control, "e", {"jsonl": {"logging_mode": "global_reduce", **options}})
        assert answer.startswith("refused: view 'jsonl'") and why in answer, (options, answer)
    kept = {"jsonl": {"logging_mode": "global_reduce", "path": "logs/{experiment}/{rank:03d}.jsonl"}}
    assert post_config(control, "e", kept) == "ok"
    own = make_sink(trust_posted_paths=True)
    absolute = {"jsonl": {"logging_mode": "global_reduce", "path": str(tmp_path / "x.jsonl")}}
    assert post_config(f"http://127.0.0.1:{own.http_port}", "e", absolute) == "ok"
