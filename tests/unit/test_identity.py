"""Process identity from the environment: launchers, precedence, the run beside the experiment."""

from __future__ import annotations

import pytest

import rankscope as rs
from rankscope.core import names as attr
from rankscope.core.identity import SLURM_ATTEMPTS, build_resource

TORCHRUN = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "TORCHELASTIC_RUN_ID": "job-42",
    "TORCHELASTIC_RESTART_COUNT": "2",
}


def test_torchrun_environment() -> None:
    a = build_resource(environ=TORCHRUN).attributes
    assert (a[attr.RANK], a[attr.LOCAL_RANK], a[attr.WORLD_SIZE]) == ("5", "1", "8")
    assert a[attr.EXPERIMENT_ID] == "job-42" and a[attr.EXPERIMENT_ATTEMPT] == 2
    assert a[attr.RUN_ID] == "job-42"  # the launch: torchrun's run id (a restart keeps it, as attempt 2)
    assert a[attr.ROLE] == a[attr.SERVICE_NAME] == "trainer"
    assert isinstance(a[attr.PROCESS_PID], int) and a[attr.HOST_NAME] and a[attr.SERVICE_INSTANCE_ID]


def test_slurm_environment() -> None:
    env = {
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "3",
        "SLURM_NTASKS": "16",
        "SLURM_JOB_ID": "991",
        "SLURM_RESTART_COUNT": "1",
    }
    a = build_resource(environ=env).attributes
    assert (a[attr.RANK], a[attr.LOCAL_RANK], a[attr.WORLD_SIZE]) == ("3", "3", "16")
    # a requeue (SLURM_RESTART_COUNT) continues the same run as a later attempt than any
    # torchelastic restart within the allocation before it
    assert a[attr.EXPERIMENT_ID] == "slurm-991" and a[attr.EXPERIMENT_ATTEMPT] == SLURM_ATTEMPTS
    assert a[attr.RUN_ID] == "slurm-991"
    elastic = {**env, "SLURM_RESTART_COUNT": "0", "TORCHELASTIC_RESTART_COUNT": "3"}
    assert build_resource(environ=elastic).attributes[attr.EXPERIMENT_ATTEMPT] == 3 < SLURM_ATTEMPTS
    stepped = build_resource(environ={**env, "SLURM_STEP_ID": "0", "RANKSCOPE_EXPERIMENT": "sweep"}).attributes
    assert (stepped[attr.EXPERIMENT_ID], stepped[attr.RUN_ID]) == ("sweep", "slurm-991.0")


def test_the_run_is_the_launchers_job_else_generated_and_a_name_is_not_a_run() -> None:
    first, second = (build_resource(environ={"RANKSCOPE_EXPERIMENT": "debug"}).attributes for _ in range(2))
    assert first[attr.EXPERIMENT_ID] == second[attr.EXPERIMENT_ID] == "debug"
    assert first[attr.RUN_ID] != second[attr.RUN_ID]  # two launches of one name: two runs
    inherited = {"RANKSCOPE_EXPERIMENT": "debug", "RANKSCOPE_RUN_ID": str(first[attr.RUN_ID]), "SLURM_JOB_ID": "7"}
    assert build_resource(environ=inherited).attributes[attr.RUN_ID] == first[attr.RUN_ID]  # beats detection
    otel = {"OTEL_RESOURCE_ATTRIBUTES": "rankscope.run.id=from-otel", "TORCHELASTIC_RUN_ID": "job-1"}
    assert build_resource(environ=otel).attributes[attr.RUN_ID] == "from-otel"
    pinned = {"RANKSCOPE_PARENT_RUN_ID": "pinned-by-parent"}  # the Lightning logger, before it starts ranks
    assert build_resource(environ=pinned).attributes[attr.RUN_ID] == "pinned-by-parent"
    node = {"TORCHELASTIC_RUN_ID": "none", "RANK": "9", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    assert attr.RUN_ID not in build_resource(environ=node).attributes  # nodes share no id: the sink keeps one run
    one_node = {**node, "WORLD_SIZE": "8"}
    assert str(build_resource(environ=one_node).attributes[attr.RUN_ID]).startswith("torchrun-")
    resumed = build_resource(environ={"RANKSCOPE_RESUME": "1"}).attributes
    assert resumed[attr.RUN_RESUME] == "latest" and attr.RUN_RESUME not in first


def test_torchrun_inside_slurm_uses_torchrun_ranks() -> None:
    env = {**TORCHRUN, "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "991"}
    a = build_resource(environ=env).attributes
    assert (a[attr.RANK], a[attr.WORLD_SIZE], a[attr.EXPERIMENT_ID]) == ("5", "8", "job-42")


def test_precedence_arguments_over_rankscope_env_over_otel_over_detection() -> None:
    env = {
        **TORCHRUN,
        "OTEL_RESOURCE_ATTRIBUTES": "rankscope.experiment.id=from-otel,rankscope.rank=6,team=rl",
        "OTEL_SERVICE_NAME": "svc",
    }
    a = build_resource(environ=env).attributes
    assert a[attr.EXPERIMENT_ID] == "from-otel" and a[attr.RANK] == "6" and a["team"] == "rl"
    assert a[attr.ROLE] == "svc" == a[attr.SERVICE_NAME]
    env |= {"RANKSCOPE_EXPERIMENT": "from-env", "RANKSCOPE_ROLE": "generator", "RANKSCOPE_REPLICA": "2"}
    a = build_resource(environ=env).attributes
    assert (a[attr.EXPERIMENT_ID], a[attr.ROLE], a[attr.REPLICA]) == ("from-env", "generator", "2")
    a = build_resource(experiment="from-arg", role="controller", replica=0, environ=env).attributes
    assert (a[attr.EXPERIMENT_ID], a[attr.ROLE], a[attr.REPLICA]) == ("from-arg", "controller", "0")


def test_torchrun_without_rdzv_id_shares_one_experiment_per_node() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}
    a, b = build_resource(environ=env).attributes, build_resource(environ={**env, "RANK": "0"}).attributes
    assert a[attr.EXPERIMENT_ID] == b[attr.EXPERIMENT_ID] and a[attr.EXPERIMENT_ID].startswith("torchrun-")


def test_plain_process_gets_a_generated_experiment_and_main_role() -> None:
    a = build_resource(environ={}).attributes
    assert a[attr.ROLE] == "main" and a[attr.RANK] == "0" and a[attr.WORLD_SIZE] == "1"
    assert build_resource(environ={}).attributes[attr.EXPERIMENT_ID] != a[attr.EXPERIMENT_ID]


def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKSCOPE_EXPORT_INTERVAL", "soon")
    with pytest.raises(ValueError, match="RANKSCOPE_EXPORT_INTERVAL='soon'"):
        rs.record_metric("x", 1.0)
