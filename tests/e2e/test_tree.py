"""Reduction as a tree on the real Collector: ranks -> agents -> gateway -> sink.

The agents and the gateway run ``collector-config/agent.yaml`` and ``gateway.yaml`` in the
built Collector, whose ``rankscopemerge`` processor (``collector/``) merges the states; the
sink is ``rankscope sink``. Values are compared with the same processes sent straight to a sink.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ..conftest import ROOT, free_port
from ..pipeline import Process, clean_env, collector, run_workers, sink_status, start_sink, wait_until_settled

WORKER = str(ROOT / "tests" / "workers" / "tree_worker.py")
ROLES = (("trainer", 8), ("generator", 4), ("replay", 4))  # 16 processes, 3 roles
KEYS = ("v/mean", "v/std", "v/sum", "v/max", "v/min", "v/count", "v/last", "v/dist")


def workers(
    env: dict[str, str], steps: int, pause: float, roles=ROLES, skip=()
) -> list[tuple[list[str], dict[str, str]]]:
    return [
        ([sys.executable, WORKER, role, str(steps), str(pause)], {**env, "RANK": str(r), "WORLD_SIZE": str(n)})
        for role, n in roles
        for r in range(n)
        if (role, r) not in skip
    ]


def views(tmp: Path) -> dict[str, Any]:
    """JSONL: the global view and the per-process view of every experiment."""
    return {
        "jsonl": {"logging_mode": "global_reduce", "path": str(tmp / "global-{experiment}.jsonl")},
        "jsonl_ranks": {
            "backend": "jsonl",
            "logging_mode": "per_rank_reduce",
            "path": str(tmp / "ranks-{experiment}.jsonl"),
        },
    }


def rows(tmp: Path, kind: str, experiment: str) -> list[dict[str, Any]]:
    path = tmp / f"{kind}-{experiment}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def global_view(tmp: Path, experiment: str) -> dict[int, dict[str, float]]:
    """{step: {key: value}}, a late update's row replacing the first one."""
    found: dict[int, dict[str, float]] = {}
    for row in rows(tmp, "global", experiment):
        if row["kind"] == "global_reduce":  # not the anomaly records beside them
            found.setdefault(row["step"], {})[row["key"]] = row["value"]
    return found


@contextmanager
def tree(
    binaries: dict[str, str], tmp: Path, sink_grpc: int, agents: int, **env: str
) -> Iterator[list[dict[str, Any]]]:
    """A gateway in front of the sink and ``agents`` agents in front of the gateway."""
    with (
        collector(binaries["otelcol"], "gateway", tmp, SINK_HOSTNAMES=f"[127.0.0.1:{sink_grpc}]", **env) as gateway,
        ExitStack() as stack,
    ):
        hostnames = f"[{gateway['endpoint']}]"
        yield [
            stack.enter_context(
                collector(binaries["otelcol"], "agent", tmp, f"agent{i}", GATEWAY_HOSTNAMES=hostnames, **env)
            )
            for i in range(agents)
        ]


def test_sixteen_processes_of_three_roles_give_the_direct_values_through_the_tree(binaries, tmp_path: Path) -> None:
    steps = 6
    grpc, http = free_port(), free_port()
    sink = start_sink(tmp_path, "sink", views(tmp_path), grpc, http, grace=20.0)
    try:
        with tree(binaries, tmp_path, grpc, agents=2, RANKSCOPE_PER_RANK_KEYS="['*/samples']") as agents:
            node = {"trainer": 0, "generator": 1, "replay": 1}  # trainers on one node, the rest on another
            commands = []
            # All 32 (the roles twice: through the tree and straight) start together and close steps
            # together, however long the box takes to start them.
            (tmp_path / "ready").mkdir()
            processes = str(2 * sum(n for _, n in ROLES))
            in_step = {"TREE_READY_DIR": str(tmp_path / "ready"), "TREE_PROCESSES": processes}
            for command, env in workers(clean_env(RANKSCOPE_EXPERIMENT="tree", **in_step), steps, 0.5):
                endpoint = agents[node[command[2]]]["endpoint"]
                commands.append((command, {**env, "RANKSCOPE_ENDPOINT": endpoint}))
            direct = clean_env(RANKSCOPE_EXPERIMENT="direct", RANKSCOPE_ENDPOINT=f"127.0.0.1:{grpc}", **in_step)
            outputs = run_workers(commands + workers(direct, steps, 0.5))
            assert all("dropped=0" in out for out in outputs), outputs
            for experiment in ("tree", "direct"):
                wait_until_settled(http, experiment, last_step=steps - 1, quiet=2.0)
            tree_status, direct_status = sink_status(http, "tree"), sink_status(http, "direct")
    finally:
        sink.stop()

    through, straight = global_view(tmp_path, "tree"), global_view(tmp_path, "direct")
    assert sorted(straight) == sorted(through) == list(range(steps))
    for step in range(steps):
        assert {k for k in straight[step] if k.startswith(("v/", "spike", "floor"))} >= {
            *KEYS[:5],
            "v/count",
            "v/last",
            "v/dist/p50",
            "spike/argmax_rank",
            "floor/argmin_rank",
        }
        for key, value in straight[step].items():
            if key.startswith(("v/", "spike", "floor", "trainer/", "generator/", "replay/")):
                assert through[step].get(key) == value, (step, key, through[step].get(key), value)
        assert through[step]["rankscope/missing_processes"] == 0.0

    # The same 16 processes. The sink takes one state per key per step per gateway window that
    # held part of the step (ranks in step: one or two, three on a busy box: 42.7 a step was seen in
    # a CI run), plus the per-rank keys unmerged: still a quarter of what the processes sent.
    assert tree_status["processes"] == direct_status["processes"] == 16
    assert direct_status["merged_points"] == 0 and tree_status["merged_points"] > 0
    per_step_direct, per_step_tree = direct_status["points"] / steps, tree_status["points"] / steps
    assert per_step_direct == 16 * (len(KEYS) + 3)  # 8 keys, {role}/samples, spike, floor per process
    print(f"\nthrough the tree {per_step_tree:.1f} points a step at the sink, straight {per_step_direct:.0f}")
    assert per_step_tree <= 16 + 10 * 3, (per_step_tree, per_step_direct)

    # Keys asked per rank (*/samples) pass the tree unmerged: every process has its own value.
    for experiment in ("tree", "direct"):
        mine = {(r["process"], r["step"]) for r in rows(tmp_path, "ranks", experiment) if r["key"].endswith("/samples")}
        assert len(mine) == 16 * steps, experiment
    merged_only = {r["key"] for r in rows(tmp_path, "ranks", "tree")}
    assert merged_only == {"trainer/samples", "generator/samples", "replay/samples"}, merged_only


def test_a_rank_that_never_reports_is_named_missing_through_the_tree(binaries, tmp_path: Path) -> None:
    steps = 3
    grpc, http = free_port(), free_port()
    sink = start_sink(tmp_path, "sink", views(tmp_path), grpc, http, grace=2.0)
    try:
        with tree(binaries, tmp_path, grpc, agents=1) as agents:
            env = clean_env(RANKSCOPE_EXPERIMENT="gap", RANKSCOPE_ENDPOINT=agents[0]["endpoint"])
            run_workers(workers(env, steps, 0.2, roles=(("trainer", 4),), skip={("trainer", 2)}))
            wait_until_settled(http, "gap", last_step=steps - 1, quiet=2.0)
    finally:
        sink.stop()
    view = global_view(tmp_path, "gap")
    assert sorted(view) == list(range(steps))
    # Named once, as on the direct path (then not waited for again until it reports, but counted
    # in every step it is absent from), though the sink saw only merged states and the others' flush markers.
    assert [view[step]["rankscope/missing_processes"] for step in range(steps)] == [1.0] * steps
    assert "step 0 finalized without 'trainer_r2' (1 missing)" in sink.text()
    assert sink.text().count("finalized without") == 1
    for step in range(steps):
        assert view[step]["trainer/samples"] == 8.0 * 3  # the three that reported, exactly


def test_an_agent_killed_mid_run_loses_no_step(binaries, tmp_path: Path) -> None:
    """SIGKILL of the agent while 8 ranks export: what it had acknowledged is in its persistent
    queue (a request is answered only once its merge window is there) and is sent after the
    restart; what it had not, the ranks send again. Nothing is lost. A window the agent was
    sending when it died comes again from its queue and the gateway takes it once; a rank whose
    answer was lost in the agent's last milliseconds sends again and may count twice (at least
    once, collector-config/README.md, failure modes): at most the step of the kill."""
    steps = 30
    grpc, http = free_port(), free_port()
    agent_grpc = free_port()
    sink = start_sink(tmp_path, "sink", views(tmp_path), grpc, http, grace=60.0)
    agent_env = {"GATEWAY_HOSTNAMES": f"[127.0.0.1:{grpc}]", "OTLP_GRPC_ENDPOINT": f"127.0.0.1:{agent_grpc}"}
    try:
        env = clean_env(RANKSCOPE_EXPERIMENT="agent-restart", RANKSCOPE_ENDPOINT=f"127.0.0.1:{agent_grpc}")
        with collector(binaries["otelcol"], "agent", tmp_path, **agent_env) as agent:
            procs = [
                subprocess.Popen(c, env=e, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for c, e in workers(env, steps, 0.2, roles=(("trainer", 8),))
            ]
            time.sleep(2.5)
            process: Process = agent["process"]
            process.stop(signal.SIGKILL)  # mid-run, mid-window
        time.sleep(1.5)
        with collector(binaries["otelcol"], "agent", tmp_path, **agent_env):  # same port, same queue directory
            for proc in procs:
                _, err = proc.communicate(timeout=180)
                assert proc.returncode == 0, err[-3000:]
            wait_until_settled(http, "agent-restart", last_step=steps - 1, quiet=3.0, timeout=180)
    finally:
        sink.stop()
    view = global_view(tmp_path, "agent-restart")
    assert sorted(view) == list(range(steps))
    twice = {step: v["trainer/samples"] for step, v in view.items() if v["trainer/samples"] != 64.0}
    assert len(twice) <= 1 and all(64.0 < v <= 128.0 for v in twice.values()), twice  # the kill's step
    for step, values in view.items():  # every step whole: all eight ranks
        assert values["trainer/samples"] >= 64.0, (step, values["trainer/samples"])
        assert values["spike/argmax_rank"] == float(step % 8)
        assert values["rankscope/missing_processes"] == 0.0


def test_argmax_and_argmin_rank_of_four_torchrun_ranks_through_the_tree(binaries, tmp_path: Path) -> None:
    steps = 4
    grpc, http = free_port(), free_port()
    backends = {**views(tmp_path), "console": {"logging_mode": "global_reduce", "format": "full"}}
    sink = start_sink(tmp_path, "sink", backends, grpc, http)
    try:
        with tree(binaries, tmp_path, grpc, agents=1) as agents:
            env = clean_env(RANKSCOPE_EXPERIMENT="argmax", RANKSCOPE_ENDPOINT=agents[0]["endpoint"])
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
            run_workers([([*command, WORKER, "trainer", str(steps), "0.1"], env)])
            wait_until_settled(http, "argmax", last_step=steps - 1, quiet=2.0)
            status = sink_status(http, "argmax")
    finally:
        sink.stop()
    assert status["merged_points"] > 0 and status["processes"] == 4
    view = global_view(tmp_path, "argmax")
    for step in range(steps):
        assert view[step]["spike"] == 100.0 and view[step]["spike/argmax_rank"] == float(step % 4)
        assert view[step]["floor"] == -100.0 and view[step]["floor/argmin_rank"] == float((step + 1) % 4)
    console = sink.text()
    for step in range(steps):  # the console names the process holding the extreme
        assert f"spike/argmax_rank: {float(step % 4)} (trainer_r{step % 4})" in console
        assert f"floor/argmin_rank: {float((step + 1) % 4)} (trainer_r{(step + 1) % 4})" in console
