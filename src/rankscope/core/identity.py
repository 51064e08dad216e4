"""Who is this process? One OTel Resource, built once per process.

Precedence, lowest first: detection (torch.distributed group > Monarch actor > torchrun /
torchelastic env > SLURM env) < ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME`` <
``RANKSCOPE_*`` < explicit ``init()`` arguments (including ``mesh=``).

An unnamed experiment is named after the entry script (``experiment_from_command``): every launch
of ``train.py`` is a run of the experiment ``train``. The launcher's id (torchrun's, Slurm's) names
the run, never the experiment.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from . import names as attr
from . import torchrun
from .errors import warn_once
from .settings import resolve


def _int_env(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        text = env.get(name, "").strip()
        if text.lstrip("-").isdigit():
            return int(text)
    return None


UNNAMED = "main"
"""The experiment of a process with no entry script to name it after (``python -c``, a REPL)."""

_SCRIPT_SUFFIXES = (".py", ".sh")
_LAUNCHERS = ("torch.distributed.", "accelerate.", "deepspeed.")
"""Modules that launch the entry script rather than being it (``python -m torch.distributed.run``)."""
_NOTEBOOK = "notebook"
"""A Jupyter kernel's experiment (its entry script is ipykernel's launcher)."""


def experiment_from_command(argv: Sequence[str]) -> str:
    """The experiment an unnamed job is: its entry script's name, so every launch of one script is
    a run of one experiment. ``train`` for ``python train.py``, ``torchrun --nproc-per-node 4
    train.py --lr 3``, ``python -m torch.distributed.run ... train.py``, ``python -m pkg.train``
    (``pkg`` for ``python -m pkg``, whose script is ``pkg/__main__.py``) and ``./train.sh``;
    ``notebook`` in a Jupyter kernel; ``main`` when there is none (``python -c``, a REPL).
    ``argv`` is a command line (``rankscope run -- CMD``) or a process's ``sys.argv[:1]``: the first
    script in it names the experiment, else its first module that is not a launcher's."""
    args = [str(a) for a in argv]
    for arg in args:
        path = Path(arg)
        if not arg.startswith("-") and path.suffix in _SCRIPT_SUFFIXES:
            name = path.parent.name if path.stem == "__main__" else path.stem
            return _NOTEBOOK if name == "ipykernel_launcher" else name or UNNAMED
    for flag, module in itertools.pairwise(args):
        if flag == "-m" and not module.startswith(_LAUNCHERS):
            return module.rsplit(".", 1)[-1] or UNNAMED
    first = Path(args[0]).name if args and args[0] and not args[0].startswith("-") else ""
    return first or UNNAMED


def detect_run(env: Mapping[str, str]) -> str | None:
    """The launcher's id of this launch: every process of it sees the same one without talking,
    and a restart within the launch (torchelastic, a SLURM requeue) keeps it. ``""``: the launch
    has no id its processes share (a multi-node torchrun without ``--rdzv-id``: each node's agent
    differs), so the data carries none and the sink keeps one run for the experiment, as before runs."""
    elastic = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic != "none":
        return _standalone_run(elastic, env) or elastic
    slurm = env.get("SLURM_JOB_ID", "").strip()
    if slurm:
        step = env.get("SLURM_STEP_ID", "").strip()
        return f"slurm-{slurm}" + (f".{step}" if step else "")
    if elastic == "none" and "RANK" in env:  # torchrun without --rdzv-id: the ranks of one node share the agent
        world, local = _int_env(env, "WORLD_SIZE"), _int_env(env, "LOCAL_WORLD_SIZE")
        if world is not None and local is not None and world > local:
            return ""
        return f"torchrun-{socket.gethostname()}-{os.getppid()}"
    return None


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _standalone_run(elastic: str, env: Mapping[str, str], proc: Path = Path("/proc")) -> str | None:
    """``torchrun --standalone``'s run as people read it: its start time and a short id
    (``20261127-101500-abf76e7e``), not the uuid it makes up. The start time is its agent's (the
    nearest torchrun among this process's ancestors, read from ``/proc``): every process of the
    launch reads the same one without talking, and a restart keeps it. None, and the uuid as it
    is, unless the id is a uuid, the job is one node, and the agent is found (no ``/proc``: None
    in every process alike)."""
    world, local = _int_env(env, "WORLD_SIZE"), _int_env(env, "LOCAL_WORLD_SIZE")
    if not _UUID.fullmatch(elastic) or (world is not None and local is not None and world > local):
        return None
    agent = torchrun.find_agent(proc)
    if agent is None:
        return None
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(agent.started)) + "-" + elastic[:8]


SLURM_ATTEMPTS = 10_000
"""A Slurm requeue counts as this many torchelastic restarts: attempts only need to grow."""


def attempt_of(env: Mapping[str, str], rendezvous_round: int | None = None) -> int:
    """Which restart of its run this launch is: a Slurm requeue (``SLURM_RESTART_COUNT``) outranks
    every torchelastic restart within one allocation. A torchelastic restart is the c10d
    rendezvous round where one was read (the same on every node: ``core.torchrun``), else this
    node's ``TORCHELASTIC_RESTART_COUNT`` (never above the round: each restart is a new round)."""
    elastic = max(_int_env(env, "TORCHELASTIC_RESTART_COUNT") or 0, rendezvous_round or 0)
    requeues = _int_env(env, "SLURM_RESTART_COUNT") or 0
    return max(0, requeues) * SLURM_ATTEMPTS + max(0, elastic)


def generate_run_id() -> str:
    """A run id for a launch no launcher named: unique, and sortable by start time."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


PARENT_RUN_ENV = "RANKSCOPE_PARENT_RUN_ID"
"""The run a process pins for the processes it will start before it initializes rankscope
itself (the Lightning logger, built before Lightning's DDP launcher starts the other ranks). It
counts only where no launcher names the run."""


def pin_run(env: MutableMapping[str, str]) -> None:
    """Pin a run id for this process and the ones it will start, unless one is set already."""
    if not env.get("RANKSCOPE_RUN_ID") and not env.get(PARENT_RUN_ENV):
        env[PARENT_RUN_ENV] = generate_run_id()


def _detect_torch_distributed() -> dict[str, Any]:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {}
    return {attr.RANK: dist.get_rank(), attr.WORLD_SIZE: dist.get_world_size()}


def _detect_monarch() -> dict[str, Any]:
    # Actor processes load monarch's internals, not always the ``monarch.actor`` facade;
    # we only look when monarch is already loaded (never import it ourselves).
    if "monarch" not in sys.modules:
        return {}
    try:
        from monarch.actor import current_rank, current_size

        point = current_rank()
        sizes = dict(current_size())
    except Exception:  # not inside an actor, or an API change: detection is best effort
        return {}
    if not sizes:
        return {}
    world = 1
    for size in sizes.values():
        world *= size
    found: dict[str, Any] = {attr.RANK: point.rank, attr.WORLD_SIZE: world, _ROLE_HINT: "actor"}
    try:  # Forge-style labels: the actor class is the role, its mesh the replica (MyActor_eLAm_r0)
        from monarch.actor import context

        instance = context().actor_instance
        name = str(instance.class_name).rsplit(".", 1)[-1]
        if name != "StepFlusher":  # rankscope's own flush actor says nothing about the process
            found[_ROLE_HINT] = name
            mesh_id = str(instance.actor_id).split("<", 1)[1].split(">", 1)[0]
            found[_REPLICA_HINT] = mesh_id[:4]
    except Exception:
        pass
    for dim in point.keys():  # noqa: SIM118 - a monarch Point, not a dict
        found[attr.mesh_rank(dim)] = point[dim]
        found[attr.mesh_size(dim)] = sizes[dim]
    return found


_ROLE_HINT = "_role"
_REPLICA_HINT = "_replica"


def _detect_mesh(mesh: Any) -> dict[str, Any]:
    """Rank and size of this process along every named dimension of a torch DeviceMesh."""
    names = getattr(mesh, "mesh_dim_names", None)
    if not names:
        raise ValueError("init(mesh=...): the DeviceMesh needs mesh_dim_names to name its dimensions")
    found: dict[str, Any] = {}
    for index, name in enumerate(names):
        found[attr.mesh_rank(name)] = mesh.get_local_rank(index)
        found[attr.mesh_size(name)] = mesh.size(index)
    return found


def build_resource(
    *,
    experiment: str | None = None,
    role: str | None = None,
    replica: str | int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    mesh: Any = None,
    resume: str | None = None,
    environ: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> Resource:
    """Build this process's Resource (see the module docstring for precedence). ``resume``
    (``latest`` or a run id) asks the sink to continue that run with this launch; ``argv``
    (default ``sys.argv[:1]``) names an unnamed experiment after its entry script."""
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}

    # Detection, weakest first so stronger sources overwrite.
    slurm_rank = _int_env(env, "SLURM_PROCID")
    if slurm_rank is not None:
        found[attr.RANK] = slurm_rank
        found[attr.LOCAL_RANK] = _int_env(env, "SLURM_LOCALID")
        found[attr.WORLD_SIZE] = _int_env(env, "SLURM_NTASKS")
    for key, names in ((attr.RANK, ("RANK",)), (attr.LOCAL_RANK, ("LOCAL_RANK",)), (attr.WORLD_SIZE, ("WORLD_SIZE",))):
        value = _int_env(env, *names)
        if value is not None:
            found[key] = value
    local, first_node = found.get(attr.LOCAL_RANK), not _int_env(env, "NODE_RANK")
    if attr.RANK not in found and local is not None and found.get(attr.WORLD_SIZE, 1) > 1 and first_node:
        # Lightning's DDP launcher sets WORLD_SIZE and LOCAL_RANK (not RANK) in the ranks it starts:
        # on the first node, a rank is its local rank.
        found[attr.RANK] = local
    found.update(_detect_monarch())
    found.update(_detect_torch_distributed())
    try:
        attempt = attempt_of(env, torchrun.rendezvous_round(env))
    except torchrun.RoundUnreadError as unread:  # said at once, and carried: the sink names the rank
        attempt = attempt_of(env)
        found[attr.ATTEMPT_FALLBACK] = str(unread)
        warn_once(
            f"rankscope: {unread}; this rank's attempt is its node's restart count ({attempt}), which can "
            "differ between nodes after a node is lost: the sink may refuse its data as an earlier "
            "attempt's (its status lists it under attempt_fallbacks)"
        )
    found.setdefault(attr.RANK, 0)
    found.setdefault(attr.WORLD_SIZE, 1)
    found.setdefault(attr.LOCAL_RANK, found[attr.RANK] if found[attr.WORLD_SIZE] == 1 else None)
    if mesh is not None:
        found.update(_detect_mesh(mesh))

    # OTEL_RESOURCE_ATTRIBUTES overrides detection; RANKSCOPE_* and arguments override it.
    otel: dict[str, Any] = dict(OTELResourceDetector().detect().attributes) if environ is None else _parse_otel(env)
    experiment_id: Any = (
        resolve("experiment", experiment, env)
        or otel.get(attr.EXPERIMENT_ID)
        or experiment_from_command(sys.argv[:1] if argv is None else argv)
    )
    role_hint, replica_hint = found.pop(_ROLE_HINT, None), found.pop(_REPLICA_HINT, None)
    role_name: Any = (
        resolve("role", role, env)
        or otel.get(attr.ROLE)
        or role_hint
        or ("trainer" if "RANK" in env or found[attr.WORLD_SIZE] > 1 else "main")
    )
    replica_id: Any = resolve("replica", replica, env)
    if replica_id is None:
        replica_id = otel.get(attr.REPLICA, replica_hint)

    values: dict[str, Any] = {k: v for k, v in found.items() if v is not None}
    values.update({k: v for k, v in otel.items() if k.startswith(attr.NAMESPACE)})
    if rank is not None:
        values[attr.RANK] = rank
    if world_size is not None:
        values[attr.WORLD_SIZE] = world_size
    values[attr.EXPERIMENT_ID] = experiment_id
    launcher = detect_run(env)
    run_id = resolve("run", None, env) or otel.get(attr.RUN_ID) or launcher
    if run_id is None:
        run_id = env.get(PARENT_RUN_ENV) or generate_run_id()
    if run_id:
        values[attr.RUN_ID] = run_id
    resume = resolve("resume", resume, env) or otel.get(attr.RUN_RESUME)
    if resume:
        values[attr.RUN_RESUME] = resume
    values[attr.ROLE] = role_name
    if replica_id is not None:
        values[attr.REPLICA] = replica_id
    values.setdefault(attr.EXPERIMENT_ATTEMPT, attempt)

    # Contract: rankscope.* are strings except the attempt (an int).
    final: dict[str, Any] = {k: str(v) for k, v in values.items()}
    final[attr.EXPERIMENT_ATTEMPT] = int(values[attr.EXPERIMENT_ATTEMPT])
    final.update({k: v for k, v in otel.items() if not k.startswith(attr.NAMESPACE)})
    final[attr.SERVICE_NAME] = env.get("OTEL_SERVICE_NAME") or otel.get(attr.SERVICE_NAME) or role_name
    if final[attr.SERVICE_NAME] == "unknown_service":
        final[attr.SERVICE_NAME] = role_name
    final[attr.SERVICE_INSTANCE_ID] = uuid.uuid4().hex
    final.setdefault(attr.HOST_NAME, socket.gethostname())
    final[attr.PROCESS_PID] = os.getpid()
    return Resource(final)


def _parse_otel(env: Mapping[str, str]) -> dict[str, Any]:
    """``OTEL_RESOURCE_ATTRIBUTES`` from an explicit mapping (tests); the SDK parses os.environ."""
    found: dict[str, Any] = {}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            found[key.strip()] = value.strip()
    return found


def process_label(attributes: Mapping[str, Any]) -> str:
    """The one short name of a process, in the SDK and in the sink: ``trainer_r1``,
    ``generator_2_r0`` (role, else ``service.name``, else ``unknown``; rank 0 when absent)."""
    role = attributes.get(attr.ROLE) or attributes.get(attr.SERVICE_NAME) or "unknown"
    rank = attributes.get(attr.RANK)
    return label_of(role, attributes.get(attr.REPLICA), 0 if rank is None else rank)


def label_of(role: Any, replica: Any, rank: Any) -> str:
    return f"{role}{'' if replica is None else f'_{replica}'}_r{rank}"


def speaker(attributes: Mapping[str, Any]) -> tuple[str, bool]:
    """How this process's own lines start, and whether it is the one of its machine that says what
    every rank of the machine sees (the same endpoint down): a rank of a multi-process job names
    itself (``rankscope [trainer_r1]``), and only each machine's first rank (local rank 0) says
    it; every rank does when its local rank is unknown."""
    if str(attributes.get(attr.WORLD_SIZE, "1")) == "1":
        return "rankscope", True
    label = "".join(c if c.isprintable() else "?" for c in process_label(attributes))
    local = attributes.get(attr.LOCAL_RANK)
    return f"rankscope [{label}]", local is None or str(local) == "0"
