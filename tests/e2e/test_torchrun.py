"""Four gloo ranks under torchrun export to one real OTLP receiver; states merge exactly."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rankscope import Reduce
from rankscope.core import names as attr

from ..conftest import ROOT
from ..otlp_receiver import GrpcReceiver
from ..workers.rank_worker import values_of


def _torchrun(nproc: int, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", script]
    return subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=240, cwd=ROOT)


def _merge(points: list, key: str, step: int) -> float:
    mine = [p for p in points if p.key == key and p.step == step]
    reduce = Reduce.get(mine[0].reduce)
    value = reduce.accumulator_class.get_reduced_value_from_states([p.state for p in mine])
    assert isinstance(value, float)
    return value


def test_four_ranks_export_distinct_resources_and_merge_exactly(receiver: GrpcReceiver) -> None:
    result = _torchrun(4, "tests/workers/rank_worker.py", {"RANKSCOPE_ENDPOINT": receiver.endpoint})
    assert result.returncode == 0, result.stderr[-4000:]
    points = receiver.wait_for(lambda ps: sum(p.key == "loss" for p in ps) == 8)

    resources = {p.resource[attr.SERVICE_INSTANCE_ID]: p.resource for p in points}
    assert len(resources) == 4
    assert sorted(r[attr.RANK] for r in resources.values()) == ["0", "1", "2", "3"]
    assert {r[attr.WORLD_SIZE] for r in resources.values()} == {"4"}
    assert {r[attr.LOCAL_RANK] for r in resources.values()} == {"0", "1", "2", "3"}
    assert len({r[attr.EXPERIMENT_ID] for r in resources.values()}) == 1  # one experiment
    assert {r[attr.ROLE] for r in resources.values()} == {"trainer"}

    for key, reduce in (("loss", "mean"), ("loss_std", "std"), ("rank_value", "sum"), ("grad_norm", "max")):
        assert {p.reduce for p in points if p.key == key} == {reduce}
        assert sorted(p.step for p in points if p.key == key) == [0, 0, 0, 0, 1, 1, 1, 1]

    for step in range(2):
        everything = np.array([v + step for r in range(4) for v in values_of(r)])
        assert _merge(points, "loss", step) == pytest.approx(everything.mean(), rel=1e-12)
        assert _merge(points, "loss_std", step) == pytest.approx(everything.std(), rel=1e-9)
        assert _merge(points, "rank_value", step) == 6.0
        assert _merge(points, "grad_norm", step) == 3.0
