"""torchtitan: its real structured logger, ``MetricsProcessor`` (as ``RankscopeMetricsProcessor``,
built from its ``Config``) and loss reductions, driven through torchtitan's step in two processes
under torchrun (gloo, CPU) into a real sink. torchtitan 0.3's ``Trainer`` itself needs CUDA (its
memory monitor), so the worker runs the step as ``Trainer.train_step`` does (docs/torchtitan.md).

Each rank's logged numbers land per rank and reduced per step (max loss and memory as MAX, the
rest as MEAN, a key overridden in the config as asked), torchtitan's ``log_trace_scalar`` values
as metrics, and each step's trace holds its ``log_trace_span`` phases nested in ``step``."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from rankscope.sink import BookConfig

from ..conftest import ROOT, free_port
from ..pipeline import clean_env, jsonl_rows, jsonl_views

pytest.importorskip("torchtitan")

STEPS = 3
NAMES = {  # torchtitan's key: rankscope's metric name
    "loss_metrics/global_avg_loss": "loss_metrics/global_avg_loss",
    "grad_norm": "grad_norm",
    "throughput(tps)": "throughput_tps",
    "mfu(%)": "mfu_pct",
    "memory/max_reserved(GiB)": "memory/max_reserved_GiB",
}
PHASES = ("fetching_batch", "fwd_bwd", "optim", "collect_dist_metrics")


@pytest.mark.timeout(300)
def test_torchtitan_metrics_and_phases_land_per_rank_and_reduced(make_sink, tmp_path: Path) -> None:
    sink = make_sink(backends=jsonl_views(tmp_path), book=BookConfig(grace=30))
    env = clean_env(
        RANKSCOPE_EXPERIMENT="titan",
        RANKSCOPE_ENDPOINT=sink.endpoint,
        RANKSCOPE_ROLE="trainer",
        TITAN_STRUCT_LOGGER_HANDLERS="rankscope.torchtitan.register_handler",
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    done = subprocess.run(
        [*command, str(ROOT / "tests" / "workers" / "torchtitan_worker.py"), str(STEPS), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    logged = {r["rank"]: {e["step"]: e for e in r["logged"]} for r in map(_load, tmp_path.glob("report-*.json"))}
    assert set(logged) == {0, 1} and all(sorted(steps) == list(range(1, STEPS + 1)) for steps in logged.values())
    sink.finalize("titan")
    assert sink.wait_written("titan")
    spans = sink.spans("titan") or []
    sink.stop()

    reduced: dict[int, dict[str, float]] = defaultdict(dict)
    for row in jsonl_rows(tmp_path / "global.jsonl"):
        if "key" in row and row.get("kind") == "global_reduce":
            reduced[row["step"]][row["key"]] = row["value"]
    per_rank: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for row in jsonl_rows(tmp_path / "ranks.jsonl"):
        if "key" in row:
            per_rank[(row["process"], row["step"])][row["key"]] = row["value"]

    for step in range(1, STEPS + 1):
        ranks = [logged[0][step], logged[1][step]]
        for rank, entry in enumerate(ranks):  # each rank's own numbers, as its processor logged them
            mine = per_rank[(f"trainer_r{rank}", step)]
            for key, name in NAMES.items():
                assert mine[name] == pytest.approx(entry[key], rel=1e-9), (rank, step, key)
            assert mine["local_valid_tokens"] == 64 * (rank + 1)  # torchtitan's log_trace_scalar
        view = reduced[step]
        assert view["loss_metrics/global_avg_loss"] == pytest.approx(ranks[0]["loss_metrics/global_avg_loss"])
        most = max(e["loss_metrics/global_max_loss"] for e in ranks)
        assert view["loss_metrics/global_max_loss"] == pytest.approx(most)
        assert view["throughput_tps"] == pytest.approx(sum(e["throughput(tps)"] for e in ranks))  # "sum", asked
        assert view["grad_norm"] == pytest.approx(sum(e["grad_norm"] for e in ranks) / 2)
        assert view["memory/max_reserved_GiB"] == pytest.approx(max(e["memory/max_reserved(GiB)"] for e in ranks))
        assert view["time_metrics/end_to_end_s"] == pytest.approx(max(e["time_metrics/end_to_end(s)"] for e in ranks))
        assert view["n_tokens_seen"] == ranks[0]["n_tokens_seen"] == 64 * 3 * step
        assert view["local_valid_tokens"] == 96.0
        for phase in PHASES:
            assert view[f"{phase}/total_duration_avg_s"] > 0

    by_process_step: dict[tuple[int, int], dict[str, Any]] = defaultdict(dict)
    for span in spans:
        by_process_step[(span.process.rank, span.step)][span.name] = span
    for rank in (0, 1):
        for step in range(1, STEPS + 1):
            found = by_process_step[(rank, step)]
            assert set(PHASES) | {"step"} <= set(found), (rank, step, sorted(found))
            outer = found["step"]
            inner = [found[name] for name in PHASES]
            assert all(span.trace_id == outer.trace_id for span in inner)
            assert all(outer.start_ns <= s.start_ns <= s.end_ns <= outer.end_ns for s in inner)
            assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(inner))  # in torchtitan's order


def _load(path: Path) -> Any:
    return json.loads(path.read_text())
