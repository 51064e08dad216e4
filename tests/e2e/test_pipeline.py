"""The real pipeline: the built OTel Collector and Jaeger v2 binaries, rankscope sinks as processes.

Binaries are built once by ``scripts/build_pipeline.py`` and cached. Every process runs on
loopback ports and is killed (with its process group) when its test ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from rankscope.backends.wandb import run_id_for
from rankscope.tracing.spans import step_ids

from ..conftest import ROOT, free_port
from ..pipeline import (
    CONFIGS,
    clean_env,
    collector,
    jaeger,
    jsonl_view,
    run_workers,
    sink_rows,
    start_sink,
    wait_http,
    wait_until_settled,
)
from ..wandb_file import by_step, run_files, run_id

WORKER = str(ROOT / "tests" / "workers" / "pipeline_worker.py")


def torchrun(
    ranks: int, role: str, steps: int, env: dict[str, str], pause: float = 0.0
) -> tuple[list[str], dict[str, str]]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    return [*command, WORKER, role, str(steps), str(pause)], env


def ranks(
    n: int, role: str, steps: int, env: dict[str, str], pause: float = 0.0
) -> list[tuple[list[str], dict[str, str]]]:
    """n plain processes that declare RANK/WORLD_SIZE (a torchrun without the rendezvous)."""
    return [
        ([sys.executable, WORKER, role, str(steps), str(pause)], {**env, "RANK": str(r), "WORLD_SIZE": str(n)})
        for r in range(n)
    ]


def test_every_config_loads_in_the_built_collector(binaries, tmp_path: Path) -> None:
    for config in ("local", "agent", "gateway"):
        env = clean_env(QUEUE_DIRECTORY=str(tmp_path / "q"))
        result = subprocess.run(
            [binaries["otelcol"], "validate", "--config", str(CONFIGS / f"{config}.yaml")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, (config, result.stderr)
        with collector(binaries["otelcol"], config, tmp_path, SINK_HOSTNAMES=f"[127.0.0.1:{free_port()}]"):
            pass  # started, answered its health check, stopped
    with jaeger(binaries["jaeger"], tmp_path) as j:
        wait_http(f"{j['query']}/api/services")


def test_end_to_end_collector_sink_wandb_and_jaeger(binaries, tmp_path: Path) -> None:
    grpc, http = free_port(), free_port()
    backends = {"wandb": {"logging_mode": "global_reduce", "dir": str(tmp_path), "project": "rankscope-tests"}}
    # the generator (plain python) can finish and say goodbye before torchrun's ranks have imported
    # torch: on a busy box, more than the default 3 s grace later, and its goodbye alone ended the
    # run (every process the sink knew had said goodbye); a grace longer than torchrun's start
    sink = start_sink(tmp_path, "sink", backends, grpc, http, grace=30.0)
    try:
        with (
            jaeger(binaries["jaeger"], tmp_path) as j,
            collector(
                binaries["otelcol"],
                "local",
                tmp_path,
                RANKSCOPE_SINK_ENDPOINT=f"127.0.0.1:{grpc}",
                JAEGER_OTLP_ENDPOINT=j["otlp"],
            ) as c,
        ):
            # torchrun's ranks and a generator the test starts beside them: one job, whose run the test names
            env = clean_env(RANKSCOPE_EXPERIMENT="e2e", RANKSCOPE_ENDPOINT=c["endpoint"], RANKSCOPE_RUN_ID="e2e-1")
            run_workers([torchrun(4, "trainer", 3, env), ([sys.executable, WORKER, "generator", "3"], env)])
            traces = {step: wait_for_trace(j["query"], step, expect_processes=5) for step in range(3)}
    finally:
        sink.stop()
    (path,) = run_files(tmp_path)  # one W&B run for the experiment, every role in it
    assert run_id(path) == run_id_for("e2e", "e2e-1")
    rows = by_step([path])
    for step in range(3):
        assert rows[step]["trainer/value"] == 1.5 + step  # mean of rank + step over 4 ranks
        assert rows[step]["trainer/count"] == 4.0
        assert rows[step]["generator/value"] == float(step)
        assert rows[step]["generator/count"] == 1.0
    for step, trace in traces.items():
        _, root_id = step_ids("e2e", 0, step)
        roots = [s for s in trace["spans"] if not s.get("references")]
        assert [s["spanID"] for s in roots] == [f"{root_id:016x}"]
        by_id = {s["spanID"]: s for s in trace["spans"]}
        blocks = [s for s in trace["spans"] if s["operationName"] in ("trainer", "generator")]
        assert len(blocks) == 5
        for span in trace["spans"]:  # every span reaches the one root
            while span.get("references"):
                span = by_id[span["references"][0]["spanID"]]
            assert span["spanID"] == f"{root_id:016x}"
        ranks_seen = {
            tag["value"]
            for b in blocks
            for tag in trace["processes"][b["processID"]]["tags"]
            if tag["key"] == "rankscope.rank" and trace["processes"][b["processID"]]["serviceName"] == "trainer"
        }
        assert ranks_seen == {"0", "1", "2", "3"}


def wait_for_trace(query: str, step: int, expect_processes: int, timeout: float = 30) -> dict[str, Any]:
    trace_id = f"{step_ids('e2e', 0, step)[0]:032x}"
    deadline = time.monotonic() + timeout
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{query}/api/traces/{trace_id}", timeout=5) as response:
                data = json.loads(response.read())["data"]
        except OSError:
            data = []
        if len(data) == 1:
            found = data[0]
            if len({s["processID"] for s in found["spans"]}) >= expect_processes:
                return found
        time.sleep(0.5)
    raise AssertionError(f"Jaeger has no complete trace for step {step}: {found}")


def test_gateway_routes_each_experiment_to_exactly_one_of_two_sinks(binaries, tmp_path: Path) -> None:
    ports = [(free_port(), free_port()) for _ in range(2)]
    sinks = [
        start_sink(tmp_path, f"sink{i}", jsonl_view(tmp_path / f"sink{i}"), g, h) for i, (g, h) in enumerate(ports)
    ]
    hostnames = "[" + ", ".join(f"127.0.0.1:{g}" for g, _ in ports) + "]"
    try:
        with (
            collector(binaries["otelcol"], "gateway", tmp_path, SINK_HOSTNAMES=hostnames) as gateway,
            collector(binaries["otelcol"], "agent", tmp_path, GATEWAY_HOSTNAMES=f"[{gateway['endpoint']}]") as agent,
        ):
            commands = []
            for experiment in ("exp-a", "exp-b", "exp-c"):
                env = clean_env(RANKSCOPE_EXPERIMENT=experiment, RANKSCOPE_ENDPOINT=agent["endpoint"])
                commands += ranks(2, "trainer", 4, env)
            run_workers(commands)
            time.sleep(3)  # the batches' way through agent and gateway
    finally:
        for sink in sinks:
            sink.stop()
    seen = [sink_rows(tmp_path / f"sink{i}") for i in range(2)]
    for experiment in ("exp-a", "exp-b", "exp-c"):
        holders = [i for i in range(2) if experiment in seen[i]]
        assert len(holders) == 1, f"{experiment} is on sinks {holders}"
        steps = seen[holders[0]][experiment]
        assert sorted(steps) == [0, 1, 2, 3]
        for step, values in steps.items():
            assert values["trainer/value"] == 0.5 + step and values["trainer/count"] == 2.0
            assert values.get("rankscope/missing_processes", 0.0) == 0.0


def test_a_sink_restart_behind_the_gateway_loses_no_step(binaries, tmp_path: Path) -> None:
    grpc, http = free_port(), free_port()
    backends = {"wandb": {"logging_mode": "global_reduce", "dir": str(tmp_path), "project": "rankscope-tests"}}
    sink = start_sink(tmp_path, "sink", backends, grpc, http)
    try:
        with collector(binaries["otelcol"], "gateway", tmp_path, SINK_HOSTNAMES=f"[127.0.0.1:{grpc}]") as gateway:
            env = clean_env(
                RANKSCOPE_EXPERIMENT="restart", RANKSCOPE_ENDPOINT=gateway["endpoint"], RANKSCOPE_RUN_ID="restart-1"
            )
            procs = [
                subprocess.Popen(c, env=e, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for c, e in ranks(2, "trainer", 24, env, pause=0.25)
            ]
            time.sleep(2.0)
            sink.proc.terminate()  # gone mid-run (as in a rolling restart): it finalizes and closes its W&B run
            sink.proc.wait(30)
            sink.stop()
            time.sleep(3.0)
            sink = start_sink(tmp_path, "sink", backends, grpc, http)
            for proc in procs:
                _, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err[-3000:]
            wait_until_settled(http, "restart", last_step=23)  # the gateway's queue drains into the new sink
    finally:
        sink.stop()
    paths = run_files(tmp_path)
    assert {run_id(p) for p in paths} == {run_id_for("restart", "restart-1")}  # the restarted sink resumed the run
    rows = by_step(paths)
    assert sorted(rows) == list(range(24)), sorted(rows)


def test_collector_down_for_the_first_60s_neither_blocks_the_job_nor_loses_a_step(binaries, tmp_path) -> None:
    """Two ranks at one step per second start while the Collector is down, and it comes up 60 s
    later: the ranks never wait on telemetry, their steps wait in the SDK's queue (default 300
    steps) and reach the sink once the Collector is there; nothing is dropped."""
    steps, outage = 75, 60.0
    grpc, http = free_port(), free_port()
    # The ranks retry independently (backoff up to ~2.4 s), so their backlogs reach the sink a
    # few seconds apart: a grace longer than that keeps every step whole instead of late-updated.
    sink = start_sink(tmp_path, "sink", jsonl_view(tmp_path), grpc, http, grace=15.0)
    collector_grpc = free_port()
    try:
        env = clean_env(
            RANKSCOPE_EXPERIMENT="late-collector",
            RANKSCOPE_ENDPOINT=f"127.0.0.1:{collector_grpc}",
            RANKSCOPE_SHUTDOWN_TIMEOUT="20",
        )
        started = time.monotonic()
        progress = [tmp_path / f"progress{r}" for r in range(2)]
        procs = [
            subprocess.Popen(
                c,
                env={**e, "WORKER_PROGRESS": str(progress[r])},
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
                stderr=subprocess.PIPE,
            )
            for r, (c, e) in enumerate(ranks(2, "trainer", steps, env, pause=1.0))
        ]
        time.sleep(max(0.0, outage - (time.monotonic() - started)))  # the job runs with nothing listening
        assert all(p.poll() is None for p in procs)
        # The training loops went on meanwhile (a loop waiting on telemetry would be at its first step).
        done_during_outage = [int(p.read_text()) if p.exists() else 0 for p in progress]
        assert min(done_during_outage) >= 20, done_during_outage
        late_env = {"OTLP_GRPC_ENDPOINT": f"127.0.0.1:{collector_grpc}"}
        with collector(
            binaries["otelcol"],
            "local",
            tmp_path,
            RANKSCOPE_SINK_ENDPOINT=f"127.0.0.1:{grpc}",
            JAEGER_OTLP_ENDPOINT=f"127.0.0.1:{free_port()}",
            **late_env,
        ):
            outputs = [p.communicate(timeout=120) for p in procs]
            wait_until_settled(http, "late-collector", last_step=steps - 1, quiet=3.0)
    finally:
        sink.stop()
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        fields = dict(part.split("=") for part in out.split())
        assert int(fields["dropped"]) == 0 and "dropp" not in err, err[-3000:]
        assert "does not take exports (" in err and "answers again" in err, err[-3000:]
    rows = sink_rows(tmp_path).get("late-collector", {})
    assert sorted(rows) == list(range(steps))
    for step, values in rows.items():  # every step whole: both ranks, exact values
        assert values["trainer/count"] == 2.0 and values["trainer/value"] == 0.5 + step
        assert values["rankscope/missing_processes"] == 0.0


def test_docker_compose_runs_the_tested_configs_at_the_tested_versions() -> None:
    """No Docker engine here: check that compose mounts the files and versions the tests above run."""
    import re

    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    manifest = (CONFIGS / "builder-config.yaml").read_text()
    version = re.search(r"^\s*version:\s*(\S+)", manifest, re.M).group(1)  # type: ignore[union-attr]
    dockerfile = (ROOT / "collector" / "Dockerfile").read_text()  # the slim build, rankscopemerge included
    assert f"ARG OCB_VERSION={version}" in dockerfile and "builder@v${OCB_VERSION}" in dockerfile
    assert "COPY collector-config/builder-config.yaml" in dockerfile and "COPY collector/ collector/" in dockerfile
    # ocb resolves output_path and the local module's path from its cwd: the manifest's directory.
    dist = yaml.safe_load(manifest)["dist"]
    binary = "/" + dist["name"]
    built = "/src/collector-config/" + dist["output_path"].removeprefix("./") + binary
    assert "WORKDIR /src/collector-config\nRUN builder --config builder-config.yaml" in dockerfile
    assert f"COPY --from=build {built} {binary}" in dockerfile and f'ENTRYPOINT ["{binary}"]' in dockerfile
    assert services["otel-collector"]["healthcheck"]["test"][1] == binary
    for name in ("otel-collector", "agent", "gateway"):
        service = services[name]
        assert service["build"] == {"context": ".", "dockerfile": "collector/Dockerfile"}, name
        assert service["image"] == f"rankscope-otelcol:{version}", name
        assert "./collector-config:/etc/otelcol:ro" in service["volumes"], name
        (config,) = [c.split("/etc/otelcol/")[1] for c in service["command"] if "/etc/otelcol/" in c]
        assert (CONFIGS / config).is_file(), config
    for name in ("otel-collector", "agent", "gateway"):  # the persistent queue directory is a named volume
        assert any(v.endswith(":/var/lib/otelcol/queue") and not v.startswith(".") for v in services[name]["volumes"])
    assert services["agent"]["environment"]["GATEWAY_HOSTNAMES"] == "[gateway:4317]"
    jaeger_mod = (ROOT / "scripts" / "jaeger" / "go.mod").read_text()
    assert "github.com/jaegertracing/jaeger v1.76.0" in jaeger_mod  # v1.76.0 is the module tag of Jaeger v2.13.0
    assert services["jaeger"]["image"] == "jaegertracing/jaeger:2.13.0"
    assert "./collector-config/jaeger.yaml:/etc/jaeger/jaeger.yaml:ro" in services["jaeger"]["volumes"]
    for name in ("sink", "jaeger", "otel-collector", "sink-0", "sink-1"):
        assert "healthcheck" in services[name], name
    assert (ROOT / services["sink"]["build"] / "Dockerfile").is_file()
    # The prometheus profile: the tested remote-write config, into the Prometheus version the tests run.
    remote = services["remote-write"]
    assert (
        remote["command"] == ["--config=/etc/otelcol/remote-write.yaml"]
        and remote["image"] == f"rankscope-otelcol:{version}"
    )
    assert remote["environment"]["RANKSCOPE_REMOTE_WRITE_URL"] == "http://prometheus:9090/api/v1/write"
    assert "--web.enable-remote-write-receiver" in services["prometheus"]["command"]
    tested = subprocess.run(["/usr/bin/prometheus", "--version"], capture_output=True, text=True, check=False)
    if tested.returncode == 0:  # Debian's, as tests/e2e/test_prometheus.py runs it
        found = re.search(r"version (\d+\.\d+\.\d+)", tested.stdout + tested.stderr)
        assert found and services["prometheus"]["image"] == f"prom/prometheus:v{found.group(1)}"
