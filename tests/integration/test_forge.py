"""The Forge seed examples on rankscope.forge (imports changed only) print Forge's numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ..conftest import ROOT, run_python


def run_example(name: str, tmp_path: Path, *args: str) -> str:
    path = str(ROOT / "examples" / name)
    code = f"import runpy, sys; sys.argv = {[name, *args]!r}; runpy.run_path({path!r}, run_name='__main__')"
    result = run_python(code, {"RANKSCOPE_RUNTIME_DIR": str(tmp_path)}, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def blocks(output: str) -> list[tuple[str, str, dict[str, float]]]:
    found = re.findall(r"=== \[(.+?)\] - METRICS STEP (\d+) ===\n(.*?)\n===============", output, re.S)
    return [
        (title, step, {k: float(v) for k, v in (line.split(": ") for line in body.splitlines())})
        for title, step, body in found
    ]


def test_single_process_example(tmp_path: Path) -> None:
    assert blocks(run_example("forge_single.py", tmp_path)) == [
        ("GlobalReduce", "0", {"my_sum_metric": 6.0, "my_max_metric": 3.0, "my_mean_metric": 2.0})
    ]


def test_actors_global_reduce(tmp_path: Path) -> None:
    assert blocks(run_example("forge_actors.py", tmp_path, "global_reduce")) == [
        ("GlobalReduce", "0", {"my_sum_rank_metric": 4.0})
    ]


def test_actors_per_rank_reduce(tmp_path: Path) -> None:
    found = blocks(run_example("forge_actors.py", tmp_path, "per_rank_reduce"))
    assert [(step, values["my_sum_rank_metric"]) for _, step, values in found] == [
        ("0", 0.0),
        ("0", 2.0),
        ("0", 0.0),
        ("0", 2.0),
    ]
    titles = [title for title, _, _ in found]
    assert all(re.fullmatch(r"MyActor_\w{4}_r[01]", t) for t in titles), titles
    assert len({t.rsplit("_r", 1)[0] for t in titles}) == 2  # labelled by mesh and rank


@pytest.mark.parametrize("mode", ["per_rank_no_reduce"])
def test_actors_per_rank_no_reduce_streams_every_value(tmp_path: Path, mode: str) -> None:
    lines = re.findall(
        r"^\[(\d)\] \[MyActor_\w{4}-(\d)/2\] \S+ \S+ INFO my_sum_rank_metric: (\S+)$",
        run_example("forge_actors.py", tmp_path, mode),
        re.M,
    )
    assert len(lines) == 8
    assert sorted(float(v) for _, _, v in lines) == [0.0] * 4 + [1.0] * 4
    assert all(rank == inner == str(int(float(v))) for rank, inner, v in lines)


def test_forge_sample_rows_become_a_sample_table_ranked_by_reward(tmp_path: Path) -> None:
    """Forge's ``record_metric(key, row, Reduce.SAMPLE)``: rows with a reward keep the 8 best and
    8 worst (``record_sample(key, row, rank_by="reward")``), each once, with provenance."""
    out = tmp_path / "rank.jsonl"
    code = f"""
import asyncio
from rankscope.forge import Reduce, get_or_create_metric_logger, record_metric

async def main():
    logger = await get_or_create_metric_logger()
    await logger.init_backends.call_one({{"jsonl": {{"logging_mode": "per_rank_reduce", "path": {str(out)!r}}}}})
    for i in range(20):
        record_metric("rollout/sample", {{"reward": i / 20, "prompt": "Q", "response": "A" * i}}, Reduce.SAMPLE)
    await logger.flush.call_one(global_step=0)
    await logger.shutdown.call_one()

asyncio.run(main())
"""
    result = run_python(code, {"RANKSCOPE_RUNTIME_DIR": str(tmp_path)}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kept = [r for r in rows if r["kind"] == "sample"]
    assert {r["table"] for r in kept} == {"rollout/sample"} and {r["step"] for r in kept} == {0}
    assert [r["row"]["reward"] for r in kept if r["side"] == "top"] == [i / 20 for i in range(19, 11, -1)]
    assert [r["row"]["reward"] for r in kept if r["side"] == "bottom"] == [i / 20 for i in range(8)]
    assert all(r["time"] > 0 and r["trace_id"] for r in kept)
