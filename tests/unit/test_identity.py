"""Process identity from the environment: launchers, precedence, the run beside the experiment."""

from __future__ import annotations

import os
import re
import time

import pytest

import rankscope as rs
from rankscope.core import names as attr
from rankscope.core.identity import SLURM_ATTEMPTS, build_resource, experiment_from_command

TORCHRUN = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "TORCHELASTIC_RUN_ID": "job-42",
    "TORCHELASTIC_RESTART_COUNT": "2",
}


def test_torchrun_environment() -> None:
    a = build_resource(environ=TORCHRUN, argv=["/home/me/train.py", "--lr", "3"]).attributes
    assert (a[attr.RANK], a[attr.LOCAL_RANK], a[attr.WORLD_SIZE]) == ("5", "1", "8")
    assert a[attr.EXPERIMENT_ID] == "train" and a[attr.EXPERIMENT_ATTEMPT] == 2  # named after the entry script
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
    a = build_resource(environ=env, argv=["train.py"]).attributes
    assert (a[attr.RANK], a[attr.LOCAL_RANK], a[attr.WORLD_SIZE]) == ("3", "3", "16")
    # a requeue (SLURM_RESTART_COUNT) continues the same run as a later attempt than any
    # torchelastic restart within the allocation before it
    assert a[attr.EXPERIMENT_ID] == "train" and a[attr.EXPERIMENT_ATTEMPT] == SLURM_ATTEMPTS
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
    assert (a[attr.RANK], a[attr.WORLD_SIZE], a[attr.RUN_ID]) == ("5", "8", "job-42")


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


def test_torchrun_without_rdzv_id_shares_one_experiment_and_run_per_node() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}
    a = build_resource(environ=env, argv=["train.py"]).attributes
    b = build_resource(environ={**env, "RANK": "0"}, argv=["train.py"]).attributes
    assert a[attr.EXPERIMENT_ID] == b[attr.EXPERIMENT_ID] == "train"
    assert a[attr.RUN_ID] == b[attr.RUN_ID] and a[attr.RUN_ID].startswith("torchrun-")


def test_an_unnamed_experiment_is_its_entry_script_and_each_launch_a_run_of_it() -> None:
    first, second = (build_resource(environ={}, argv=["/home/me/train.py"]).attributes for _ in range(2))
    assert first[attr.ROLE] == "main" and first[attr.RANK] == "0" and first[attr.WORLD_SIZE] == "1"
    assert first[attr.EXPERIMENT_ID] == second[attr.EXPERIMENT_ID] == "train"
    assert first[attr.RUN_ID] != second[attr.RUN_ID]  # re-runs of a script: runs of one experiment
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", str(first[attr.RUN_ID]))  # its start time and a short id
    named = {
        ("python", "-m", "pkg.train"): "train",
        ("/srv/pkg/__main__.py",): "pkg",
        ("torchrun", "--nproc-per-node", "4", "train.py", "--lr", "3"): "train",
        ("python", "-m", "torch.distributed.run", "--standalone", "/x/train.py"): "train",
        ("python", "-m", "torch.distributed.run", "-m", "pkg.train"): "train",
        ("./launch.sh",): "launch",
        ("-c",): "main",
        ("",): "main",
        ("/env/lib/ipykernel_launcher.py", "-f", "k.json"): "notebook",
    }
    assert {argv: experiment_from_command(argv) for argv in named} == named


def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKSCOPE_EXPORT_INTERVAL", "soon")
    with pytest.raises(ValueError, match="RANKSCOPE_EXPORT_INTERVAL='soon'"):
        rs.record_metric("x", 1.0)


def test_torchrun_standalone_runs_are_shown_as_the_agents_start_time_and_a_short_id(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--standalone`` makes up a uuid: each process reads its agent's start time from /proc (a fake one here)."""
    from rankscope.core import identity

    proc = tmp_path / "proc"

    def process(pid: int, parent: int, started_ticks: int, *cmdline: str) -> None:
        (proc / str(pid)).mkdir(parents=True)
        fields = ["S", str(parent), *["0"] * 17, str(started_ticks)]  # fields 3.. of /proc/PID/stat
        (proc / str(pid) / "stat").write_text(f"{pid} (py thon) " + " ".join(fields) + "\n")
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(c.encode() for c in cmdline) + b"\0")

    (proc).mkdir()
    (proc / "stat").write_text("cpu 1 2 3\nbtime 1800000000\n")
    process(40, 1, 100 * os.sysconf("SC_CLK_TCK"), "/usr/bin/python3", "/venv/bin/torchrun", "--standalone", "t.py")
    process(41, 40, 0, "/usr/bin/python3", "-u", "train.py")  # a rank
    uuid = "abf76e7e-3c5d-4ad0-9f62-1b2c3d4e5f60"
    env = {"TORCHELASTIC_RUN_ID": uuid, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(1_800_000_100))
    for parent in (40, 41):  # a rank, and a process a rank started
        monkeypatch.setattr(os, "getppid", lambda parent=parent: parent)
        assert identity._standalone_run(uuid, env, proc) == f"{stamp}-abf76e7e"
    assert identity._standalone_run("job-42", env, proc) is None  # your --rdzv-id stays as you wrote it
    assert identity._standalone_run(uuid, {**env, "WORLD_SIZE": "4"}, proc) is None  # nodes share no agent
    assert identity._standalone_run(uuid, env, tmp_path / "no-proc") is None  # no /proc: the uuid, everywhere


def test_the_rendezvous_to_read_the_round_from_is_torchruns_c10d_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsed by torchrun's own parser from its command line; only c10d keeps a round to read."""
    from rankscope.core import identity
    from rankscope.core.torchrun import _rendezvous_of

    c10d = ["--nnodes=2:3", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500", "--rdzv-id=j", "train.py"]
    assert _rendezvous_of(c10d, {}) == ("10.0.0.1", 29500)
    spaced = ["--nnodes", "4", "--rdzv_backend", "c10d", "--rdzv_endpoint", "node-a", "t.py", "--lr=1"]
    assert _rendezvous_of(spaced, {}) == ("node-a", 29400)
    one_node = ["--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500", "train.py"]
    assert _rendezvous_of(one_node, {}) is None  # one agent: its restart count is the world's
    own_store = ["--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "train.py"]
    assert _rendezvous_of(own_store, {}) is None  # port 0: a store of its own, nothing to connect to
    assert _rendezvous_of(["--nnodes=2", "--master-addr=a", "train.py"], {}) is None  # static: the restart count
    assert _rendezvous_of(["--standalone", "--nproc-per-node=8", "train.py"], {}) is None  # one agent
    assert _rendezvous_of(["--rdzv-backend=c10d", "--no-such-flag"], {}) is None  # its parser refuses it: no round
    monkeypatch.setenv("PET_RDZV_BACKEND", "c10d")  # torchrun's flags as its variables, which its ranks inherit
    monkeypatch.setenv("PET_NNODES", "2")
    assert _rendezvous_of(["--rdzv-endpoint=h:1", "t.py"], dict(os.environ)) == ("h", 1)
    # the round outranks this node's own count, a Slurm requeue outranks both
    assert identity.attempt_of({"TORCHELASTIC_RESTART_COUNT": "0"}, 2) == 2
    assert identity.attempt_of({"TORCHELASTIC_RESTART_COUNT": "1"}, None) == 1
    assert identity.attempt_of({"SLURM_RESTART_COUNT": "1"}, 3) == SLURM_ATTEMPTS + 3
