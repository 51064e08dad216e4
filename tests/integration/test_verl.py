"""verl: ``rankscope`` as one of verl's own tracking backends, and verl's workers timed by role.

verl's trainer needs GPUs and a rollout engine, so the example plays it with verl's own parts on
CPU (``examples/verl_tracking.py``): Ray started with the documented setup hook
(``rankscope.verl.register``), a Ray actor in the place of verl's ``TaskRunner`` that drives worker
groups of verl's single controller (``actor`` and ``ref`` colocated in two processes, ``critic`` in
one, as verl's ``create_colocated_worker_cls`` builds them) and logs their reduced metrics through
verl's real ``Tracking(default_backend=["console", "rankscope"])``, into a real sink."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from rankscope.sink import BookConfig

from ..conftest import ROOT
from ..pipeline import clean_env, jsonl_rows, jsonl_views

pytest.importorskip("verl")
pytest.importorskip("ray")

STEPS = 3


@pytest.mark.timeout(360)
def test_verl_trainer_steps_and_worker_roles_land_in_one_experiment(make_sink, tmp_path: Path) -> None:
    sink = make_sink(backends=jsonl_views(tmp_path), book=BookConfig(grace=30))
    # no RANKSCOPE_EXPERIMENT. Ray starts its workers at nice 15: beside two busy loops they got a few
    # per cent of a core and the job took 7-14 min (33 s at nice 0, as the job's other processes run)
    env = clean_env(RANKSCOPE_ENDPOINT=sink.endpoint, RAY_worker_niceness="0")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "verl_tracking.py"), str(STEPS)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    logged = [json.loads(line[len("logged ") :]) for line in done.stdout.splitlines() if line.startswith("logged ")]
    assert [entry["step"] for entry in logged] == list(range(1, STEPS + 1))
    sink.finalize("verl")
    assert sink.wait_written("verl")
    spans = sink.spans("verl") or []
    sink.stop()

    views_by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for row in jsonl_rows(tmp_path / "global.jsonl"):
        if "key" in row and row.get("kind") == "global_reduce":
            assert not row.get("late"), row
            assert row["experiment"] == "verl"  # RANKSCOPE_EXPERIMENT unset: every process of the job in one
            views_by_step[row["step"]][row["key"]] = row["value"]
    assert views_by_step[0]["val-core/toy/reward/mean_at4"] == 0.12  # validation, at step 0

    for entry in logged:  # every number the trainer logged, at its global step
        step = entry.pop("step")
        got = {key: views_by_step[step][key] for key in entry}
        assert got == pytest.approx(entry), step

    # Each worker process reports as its verl roles (colocated as verl colocates them) and rank, each
    # verl method it offers timed once (not the registered call it makes itself: actor/lr), stamped
    # with the trainer's step in the worker itself, in time: no step waited out its grace period.
    timed = {
        "actor+ref_r0": ("actor/compute_log_prob", "ref/compute_ref_log_prob", "actor/update_actor"),
        "actor+ref_r1": ("actor/compute_log_prob", "ref/compute_ref_log_prob", "actor/update_actor"),
        "critic_r0": ("critic/update_critic",),
    }
    per_rank: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for row in jsonl_rows(tmp_path / "ranks.jsonl"):
        if "key" in row:
            assert not row.get("late"), row
            per_rank[(row["process"], row["step"])][row["key"]] = row["value"]
    assert {process for process, _ in per_rank} == {"trainer_r0", *timed}
    for step in range(1, STEPS + 1):
        assert views_by_step[step]["rankscope/missing_processes"] == 0.0, step
        for process, methods in timed.items():
            keys = {key for key in per_rank[(process, step)] if key.endswith("/total_duration_avg_s")}
            assert keys == {f"{method}/total_duration_avg_s" for method in methods}, (process, step)

    # Each step's trace holds the workers' spans, in the order the trainer called them.
    by_step: dict[int, dict[tuple[str, int], Any]] = defaultdict(dict)
    for span in spans:
        by_step[span.step][(span.name, span.process.rank)] = span
    for step in range(1, STEPS + 1):
        found = by_step[step]
        critic = found[("critic/update_critic", 0)]
        for rank in (0, 1):
            old, ref = found[("actor/compute_log_prob", rank)], found[("ref/compute_ref_log_prob", rank)]
            update = found[("actor/update_actor", rank)]
            assert old.end_ns <= ref.start_ns and ref.end_ns <= critic.start_ns, (step, rank)
            assert critic.end_ns <= update.start_ns and old.trace_id == update.trace_id == critic.trace_id


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
