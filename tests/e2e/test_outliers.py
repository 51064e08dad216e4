"""The rank whose values diverge (issue 52), as a user meets it: real torchrun ranks on gloo training
one model data-parallel, one rank's recorded loss made to diverge from a known step, into a real
sink; read back from its JSONL view and status route."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rankscope.sink import BookConfig

from .. import browser
from ..conftest import ROOT, free_port
from ..pipeline import clean_env

WORKER = str(ROOT / "tests" / "workers" / "outlier_worker.py")


def _job(
    make_sink: Any, tmp_path: Path, experiment: str, steps: int, *more: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    path = tmp_path / "global.jsonl"
    backends = {
        "jsonl": {"logging_mode": "global_reduce", "path": str(path)},
        "report": {"backend": "report", "path": str(tmp_path / "report.html")},
    }
    sink = make_sink(backends=backends, book=BookConfig(grace=30))
    env = clean_env(RANKSCOPE_EXPERIMENT=experiment, RANKSCOPE_ENDPOINT=sink.endpoint)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=6",
        WORKER,
        "--steps",
        str(steps),
        *more,
    ]
    job = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = job.communicate(timeout=150)
        assert job.returncode == 0, stderr[-4000:]
    finally:
        if job.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    sink.finalize(experiment)
    assert sink.wait_written(experiment)
    status = sink.status(experiment)
    assert status is not None
    sink.stop()  # the run closes: the report page is written whole
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return rows, status


@pytest.mark.timeout(180)
def test_a_rank_whose_loss_diverges_is_named_by_its_third_step_and_only_it(
    make_sink, tmp_path: Path, browser_ready: None
) -> None:
    """6 ranks (5 others: the fewest judged by default); rank 1's loss is +5 from step 10: named
    once, by step 12 (3 judged steps in a row), with its value against the others' mean and
    spread; no other rank, no other key. The report says it on top and draws its own line on the
    loss chart."""
    rows, status = _job(make_sink, tmp_path, "diverge", 20, "--diverge", "1:10:5.0")
    said = [r for r in rows if r["kind"] == "anomaly" and r["type"] == "outlier"]
    assert [(r["process"], r["key"], r["first_step"]) for r in said] == [("trainer_r1", "loss", 10)], said
    (record,) = said
    assert record["steps"] == 3 and record["value"] - record["others_mean"] > 4.5 and record["sigmas"] > 6, record
    at = rows.index(record)  # said with its third step's view: written among that step's rows
    before = max(r["step"] for r in rows[:at] if r["kind"] == "global_reduce")
    assert before in (11, 12), before
    live = status["outlier_streaks"]
    assert [(r["process"], r["key"], r["first_step"], r["last_step"]) for r in live] == [("trainer_r1", "loss", 10, 19)]
    assert status["anomaly_counts"].get("outlier") == 1
    with browser.chromium() as driver:
        browser.open_report(driver, tmp_path / "report.html", timeout=60.0)
        assert browser.errors(driver) == []
        alerts = [a for a in browser.texts(driver, ".alert") if a.startswith("outlier:")]
        drawn = browser.svg_text(driver)
    assert len(alerts) == 1 and alerts[0].startswith("outlier: trainer_r1 loss "), alerts
    assert "trainer_r1 (outlier)" in drawn, drawn


@pytest.mark.timeout(240)
def test_no_rank_diverging_names_no_one_in_a_hundred_steps(make_sink, tmp_path: Path) -> None:
    """Each rank's own batches make its loss differ from the others' every step: in 100 steps the
    default thresholds (6 sigmas of the others, 5 % of their mean, 3 steps in a row) name no one."""
    rows, status = _job(make_sink, tmp_path, "even", 100)
    assert [r for r in rows if r["kind"] == "anomaly" and r["type"] == "outlier"] == []
    assert status["outlier_streaks"] == [] and "outlier" not in status["anomaly_counts"]
    assert {r["step"] for r in rows if r["kind"] == "global_reduce" and r["key"] == "loss"} == set(range(100))


OUTLIER_VALUES = str(ROOT / "tests" / "workers" / "outlier_values_worker.py")


@pytest.mark.timeout(300)
def test_32_processes_straight_and_through_agents_and_a_gateway_name_exactly_the_two_outliers(
    binaries, tmp_path: Path
) -> None:
    """32 processes (no torch) with noisy values: rank 13's loss +0.8 from step 5, rank 27's grad
    norm 3x from step 8. Straight to a ``rankscope sink`` and through two agents and a gateway
    (the Go merge processor carries each key's spread of the processes' values): exactly those
    two named, with their first steps, in both."""
    from ..pipeline import run_workers, start_sink, wait_until_settled
    from .test_tree import rows, tree, views

    steps, grpc, http = 12, free_port(), free_port()
    sink = start_sink(tmp_path, "sink", views(tmp_path), grpc, http, grace=20.0)
    try:
        with tree(binaries, tmp_path, grpc, agents=2) as agents:
            for experiment in ("direct", "tree"):
                at = {"TREE_START_AT": str(time.time() + 6)}
                commands = []
                for rank in range(32):
                    endpoint = f"127.0.0.1:{grpc}" if experiment == "direct" else agents[rank // 16]["endpoint"]
                    env = clean_env(
                        RANKSCOPE_EXPERIMENT=experiment,
                        RANKSCOPE_ENDPOINT=endpoint,
                        RANK=str(rank),
                        WORLD_SIZE="32",
                        **at,
                    )
                    commands.append(([sys.executable, OUTLIER_VALUES, str(steps), "0.4"], env))
                outputs = run_workers(commands)
                assert all("dropped=0" in out for out in outputs), outputs
                wait_until_settled(http, experiment, last_step=steps - 1, quiet=2.0)
    finally:
        sink.stop()
    for experiment in ("direct", "tree"):
        said = [r for r in rows(tmp_path, "global", experiment) if r["kind"] == "anomaly" and r["type"] == "outlier"]
        named = sorted((r["process"], r["key"], r["first_step"]) for r in said)
        assert named == [("trainer_r13", "loss", 5), ("trainer_r27", "grad_norm", 8)], (experiment, said)
        loss = next(r for r in said if r["key"] == "loss")
        assert loss["others"] == 31 and abs(loss["others_mean"] - 1.0) < 0.01 and loss["sigmas"] > 50, loss
