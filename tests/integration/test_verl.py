"""verl: ``rankscope`` as one of verl's own tracking backends (``verl.utils.tracking.Tracking``).

The example's Ray actor stands in for verl's ``TaskRunner`` (verl's trainer needs GPUs and a rollout
engine): Ray runs ``rankscope.verl.register`` in it through the runtime environment's setup hook,
as the documented ``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook`` does, and the actor
builds verl's real ``Tracking(default_backend=["console", "rankscope"])`` and logs verl-shaped
metrics at global steps 0..3, into a real sink."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ROOT
from ..pipeline import clean_env

pytest.importorskip("verl")
pytest.importorskip("ray")

STEPS = 3


@pytest.mark.timeout(240)
def test_verl_tracking_backend_records_each_global_step(make_sink, tmp_path: Path) -> None:
    views = {
        "global": {"backend": "jsonl", "logging_mode": "global_reduce", "path": str(tmp_path / "global.jsonl")},
        "per_rank": {"backend": "jsonl", "logging_mode": "per_rank_reduce", "path": str(tmp_path / "ranks.jsonl")},
    }
    sink = make_sink(backends=views, grace=30)
    env = clean_env(RANKSCOPE_ENDPOINT=sink.endpoint)  # no RANKSCOPE_EXPERIMENT: verl's experiment name
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "verl_tracking.py"), str(STEPS)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    logged = [json.loads(line[len("logged ") :]) for line in done.stdout.splitlines() if line.startswith("logged ")]
    assert [entry["step"] for entry in logged] == list(range(STEPS + 1))
    sink.finalize("verl-example")
    assert sink.wait_written("verl-example")
    sink.stop()

    views_by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for row in _rows(tmp_path / "global.jsonl"):
        if "key" in row and row.get("kind") == "global_reduce":
            assert row["experiment"] == "verl-example"
            views_by_step[row["step"]][row["key"]] = row["value"]
    processes = {row["process"] for row in _rows(tmp_path / "ranks.jsonl") if "key" in row}
    assert processes == {"trainer_r0"}  # the Ray actor that builds Tracking: the trainer

    for entry in logged:  # every number verl logged, at its global step, under a valid name
        step = entry.pop("step")
        expected = {key.replace("@", "_at"): float(value) for key, value in entry.items()}
        got = {key: value for key, value in views_by_step[step].items() if not key.startswith("rankscope/")}
        assert got == pytest.approx(expected), step


def test_register_keeps_verl_tracking_as_it_was() -> None:
    """Registering twice adds one backend; verl still refuses a backend it does not know, and a
    Tracking without rankscope builds no rankscope backend."""
    from verl.utils.tracking import Tracking

    import rankscope.verl

    rankscope.verl.register()
    rankscope.verl.register()
    assert Tracking.supported_backend.count("rankscope") == 1
    with pytest.raises(AssertionError, match="not supported"):
        Tracking(project_name="p", experiment_name="e", default_backend=["nonesuch"])
    plain = Tracking(project_name="p", experiment_name="e", default_backend="console")
    assert set(plain.logger) == {"console"}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
