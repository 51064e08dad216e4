"""The two showcase examples, run as users run them: under ``opentelemetry-instrument`` with no
rankscope code of their own (DDP) or only the distro plus a few one-liners (toy GRPO on
Monarch), into a real sink on loopback; read back from its views, its stored spans and W&B's
offline run file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from rankscope.metrics.catalog import CATALOG
from rankscope.sink import BookConfig

from ..conftest import ROOT
from ..wandb_file import by_step, run_files, wandb_tables
from .test_trace_steps import stored_spans

BIN = Path(sys.executable).parent


def _instrumented(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    full.update(env, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    result = subprocess.run(
        [str(BIN / "opentelemetry-instrument"), *command],
        env=full,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _rows(path: Path) -> dict[Any, dict[str, Any]]:
    found: dict[Any, dict[str, Any]] = defaultdict(dict)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        label = row["step"] if row["kind"] == "global_reduce" else (row["step"], row["rank"])
        found[label][row["key"]] = row["value"]
    return found


def test_plain_ddp_script_under_opentelemetry_instrument(make_sink, tmp_path: Path) -> None:
    views = tmp_path / "global.jsonl"
    per_rank = tmp_path / "per_rank.jsonl"
    sink = make_sink(
        backends={
            "global": {"backend": "jsonl", "logging_mode": "global_reduce", "path": str(views)},
            "ranks": {"backend": "jsonl", "logging_mode": "per_rank_reduce", "path": str(per_rank)},
        }
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {"RANKSCOPE_EXPERIMENT": "ddp", "RANKSCOPE_ENDPOINT": sink.endpoint, "DDP_CHECKPOINT": str(tmp_path / "m.pt")}
    result = _instrumented([*torchrun, str(ROOT / "examples" / "ddp_plain.py")], env, tmp_path)
    assert "step 4: loss" in result.stdout  # the script itself is unchanged
    sink.finalize("ddp")
    assert sink.wait_written("ddp")

    # One rankscope step per optimizer step, reduced across both ranks at the sink.
    steps = _rows(views)
    assert [s for s in steps if s is not None] == [0, 1, 2, 3, 4, 5]
    for step in range(5):
        row = steps[step]
        assert row["optimizer/steps"] == 2.0 and row["dataloader/batches"] == 2.0
        assert row["optimizer/lr/group_0"] == 1e-3 / (step + 1)  # the LambdaLR schedule
        assert row["optimizer/step_max_s"] >= row["optimizer/step_s"] > 0
        assert row["dataloader/wait_max_s"] >= row["dataloader/wait_s"] > 0
        assert row["rankscope/missing_processes"] == 0
    # Each step's all-reduces: DDP's one gradient bucket (2,177 float32 parameters, routed through
    # ``dist.all_reduce`` by ``tracing.ddp``) in the step its optimizer step closes, and the loss
    # averaging of the iteration before, which follows that iteration's optimizer step.
    grads = 4 * sum(
        p.numel() for p in torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 1)).parameters()
    )
    for step in range(6):
        bucket, averaged = step < 5, step > 0
        calls, nbytes = 2 * (bucket + averaged), 2 * (grads * bucket + 4 * averaged)
        assert (steps[step]["comm/all_reduce/calls"], steps[step]["comm/all_reduce/bytes"]) == (calls, nbytes), step
        assert steps[step]["comm/all_reduce/duration_s"] > 0
    assert steps[5]["checkpoint/save_bytes"] == (tmp_path / "m.pt").stat().st_size

    # Per-rank views: each rank's own data wait and collective time.
    ranks = _rows(per_rank)
    for rank in (0, 1):
        assert ranks[(2, rank)]["dataloader/wait_s"] > 0 and ranks[(2, rank)]["comm/all_reduce/duration_s"] > 0

    # Optimizer-step spans per rank per step, each in its step's trace.
    spans = stored_spans(sink, "ddp")
    optimizer_spans = {(s["step"], s["rank"]) for s in spans if s["name"] == "optimizer/step"}
    assert optimizer_spans == {(step, rank) for step in range(5) for rank in (0, 1)}
    comm = [s for s in spans if s["name"] == "comm/all_reduce"]
    assert {s["attributes"]["rankscope.comm.group_size"] for s in comm} == {2}


EXAMPLE_KEYS = {
    "{Class}.{endpoint}": [
        "Generator.generate",
        "Generator.sync_weights",
        "Trainer.train_step",
        "Trainer.get_weights",
        "Trainer.save",
        "ReplayBuffer.add",
        "ReplayBuffer.sample",
    ],
    "{op}": ["all_reduce"],
    "{i}": ["0"],
}
NOT_IN_THE_TOY = {
    "optimizer/grad_norm": "opt-in (RANKSCOPE_GRAD_NORM)",
    "optimizer/closure_s": "the toy's optimizer.step() takes no closure",
    "dataloader/": "the trainer reads batches from the replay buffer",
    "cuda/": "CPU only",
    "gpu/": "CPU only (NVML)",
    "host/": "opt-in (RANKSCOPE_HOST_METRICS)",
    "throughput/mfu": "no peak FLOPs for a CPU",
    "checkpoint/load": "the toy only saves",
    "torchelastic/": "not under torchrun",
}


def _expected_keys() -> set[str]:
    """Every catalog name the toy exercises, templates expanded; DISTRIBUTION keys as written."""
    keys: set[str] = set()
    for spec in CATALOG:
        if any(spec.name.startswith(prefix) for prefix in NOT_IN_THE_TOY):
            continue
        names = [spec.name]
        for template, values in EXAMPLE_KEYS.items():
            if template in spec.name:
                names = [n.replace(template, v) for n in names for v in values]
        for name in names:
            keys.add(f"{name}/p50" if spec.reduce.value == "distribution" else name)
    return keys


def test_toy_grpo_fills_one_wandb_run_with_every_role_and_a_cross_actor_trace(
    make_sink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's process-wide settings are made once, from the env
    wandb = {"logging_mode": "global_reduce", "dir": str(tmp_path), "mode": "offline"}
    sink = make_sink(backends={"wandb": wandb}, book=BookConfig(grace=30))
    env = {"RANKSCOPE_EXPERIMENT": "grpo", "RANKSCOPE_ENDPOINT": sink.endpoint, "WANDB_MODE": "offline"}
    command = [sys.executable, str(ROOT / "examples" / "grpo_monarch.py"), "--steps", "6", "--sync-every", "3"]
    _instrumented(command, env, tmp_path)
    sink.finalize("grpo")
    assert sink.wait_written("grpo")
    spans = stored_spans(sink, "grpo")
    sink.stop()

    (path,) = run_files(tmp_path)  # every role in one run
    rows = by_step([path])
    assert sorted(rows) == list(range(7))
    seen = set().union(*rows.values())
    missing = _expected_keys() - seen
    assert not missing, sorted(missing)
    for step in range(6):
        assert rows[step]["rankscope/missing_processes"] == 0
        assert rows[step]["endpoint/Generator.generate/calls"] == 2.0  # two replicas, once each
        assert rows[step]["policy/version"] == step + 1
    # Weights reach the generators every 3 steps: staleness climbs between syncs, drops after.
    assert [rows[step]["generator/policy_staleness"] for step in range(6)] == [0, 1, 2, 0, 1, 2]

    # controller -> generator -> trainer: one chain of parent/child spans in the step's trace.
    by_id = {s["span_id"]: s for s in spans}
    chains = []
    for span in spans:
        if span["name"] != "Trainer.get_weights":
            continue
        generator = by_id.get(span["parent_span_id"])
        controller = by_id.get(generator["parent_span_id"]) if generator else None
        if generator and controller:
            chains.append((controller["role"], generator["name"], generator["role"], span["role"]))
            assert span["trace_id"] == generator["trace_id"] == controller["trace_id"]
            assert generator["attributes"]["rankscope.actor.coords"] in ("procs=0", "procs=1")
    assert chains and set(chains) == {("controller", "Generator.sync_weights", "Generator", "Trainer")}, chains

    # Samples: each step's rollouts table holds the best and worst 2 rollouts of both replicas,
    # each row naming its generator, the policy version it was generated with and its trace.
    tables = wandb_tables(path, "rollouts")
    assert sorted(tables) == list(range(6))
    for step, kept in tables.items():
        assert [r["side"] for r in kept] == ["top", "top", "bottom", "bottom"], kept
        top, bottom = [r["reward"] for r in kept[:2]], [r["reward"] for r in kept[2:]]
        assert top == sorted(top, reverse=True) and bottom == sorted(bottom) and min(top) >= max(bottom)
        for row in kept:
            assert row["role"] == "Generator" and row["rank"] in (0, 1), row  # which generator: replica and rank
            assert row["process"] == f"Generator_{row['replica']}_r{row['rank']}"
            assert row["policy_version"] == 3 * (step // 3)  # weights pulled every 3 steps
            assert row["trace_id"] == next(s["trace_id"] for s in spans if s["step"] == step)
            assert row["prompt"] in (0, 1, 2) and len(row["completion"].split()) == 6
    assert {row["rank"] for kept in tables.values() for row in kept} == {0, 1}  # both replicas' rollouts
    # Lineage: each Trainer.train_step span links to the Generator.generate spans of its batch.
    generate = {s["span_id"]: s for s in spans if s["name"] == "Generator.generate"}
    train = [s for s in spans if s["name"] == "Trainer.train_step"]
    assert len(train) == 6
    for span in train:
        linked = [generate.get(link["span_id"]) for link in span["links"]]
        assert linked and all(linked), span["links"]  # every link names a stored generation span
        assert {g["rank"] for g in linked} == {0, 1}  # the batch mixes both replicas' rollouts
        assert all(g["step"] <= span["step"] for g in linked)
    assert [rows[step]["rl/staleness_tokens_weighted"] for step in range(6)] == [0, 1, 2, 0, 1, 2]
