"""What a rank can learn from the torchrun that started it: its agent's start time and command
(from ``/proc``), and the round of its c10d rendezvous (from the rendezvous store's keys).

torchelastic's ``TORCHELASTIC_RESTART_COUNT`` counts the restarts of one node's agent: after a node
is lost, a node whose ranks failed counts one, a node whose ranks were still healthy (waiting in a
collective) restarts them for the membership change without counting. The rendezvous round is the
same on every node of a world and grows with every re-rendezvous, so the attempt comes from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

_COMMANDS = ("torch.distributed.run", "torch/distributed/run.py", "torchrun")
_STORE_TIMEOUT = timedelta(seconds=5)
_ROUND_PREFIX = "torch.rendezvous."
"""The prefix of a round's keys in the rendezvous store: ``{this}{run id}.{round}/`` (torch's
``DynamicRendezvousHandler._wrap_store``)."""
_ROLE_INFO_OF_RANK_0 = "torchelastic/role_info/0"
"""What group rank 0's agent writes each round before it starts its workers (torch's
``SimpleElasticAgent._assign_worker_ranks``)."""


@dataclass(frozen=True)
class Agent:
    """The nearest torchrun among this process's ancestors."""

    started: float  # seconds since the epoch
    arguments: list[str]  # its command line after the torchrun program itself


def find_agent(proc: Path = Path("/proc")) -> Agent | None:
    """This process's torchrun agent, read from ``/proc`` (None: no agent, or no ``/proc``). It
    looks past a few ancestors: a process a rank started finds its rank's agent too."""
    try:
        lines = (proc / "stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in lines if line.startswith("btime"))
        pid = os.getppid()
        for _ in range(8):
            if pid <= 1:
                return None
            after = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
            command = (proc / str(pid) / "cmdline").read_bytes().removesuffix(b"\0").split(b"\0")
            for i, part in enumerate(p.decode(errors="replace") for p in command[:3]):
                if part.endswith(_COMMANDS):
                    started = boot + int(after[19]) / os.sysconf("SC_CLK_TCK")
                    return Agent(started, [p.decode(errors="replace") for p in command[i + 1 :]])
            pid = int(after[1])
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return None


class RoundUnreadError(Exception):
    """The rendezvous store was out of reach (or held no round): the attempt falls back to this
    node's restart count, which can differ between nodes after a node is lost (``core.identity``
    says so on the rank's console and in its Resource)."""


def rendezvous_round(env: Mapping[str, str], proc: Path = Path("/proc")) -> int | None:
    """The round of the c10d rendezvous this rank's world was formed in. None where there is none to
    read: not torchrun, one node at most (``--standalone``, ``--nnodes=1``, a static rendezvous: one
    agent's restart count is the world's). Raises ``RoundUnreadError`` when the store is out of reach.

    Each round, every agent writes its role info under the round's prefix of the rendezvous store
    (``torch.rendezvous.{run id}.{round}/torchelastic/role_info/{group rank}``) before it starts its
    workers, group rank 0's in every round. So the world's round is the last one holding group rank
    0's: found with a few ``check`` calls of ~100 bytes (from this node's restart count, which is
    never above it, doubling, then halving), not by reading the rendezvous state, which grows with
    the nodes (~136 KB at 1,250) and which every rank of a 10,000-rank job would pull at once."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if not run_id:
        return None
    agent = find_agent(proc)
    rendezvous = None if agent is None else _rendezvous_of(agent.arguments, env)
    if rendezvous is None:
        return None
    host, port = rendezvous
    try:
        from torch.distributed import TCPStore

        store = TCPStore(host, port, is_master=False, timeout=_STORE_TIMEOUT)

        def formed(r: int) -> bool:
            return bool(store.check([f"{_ROUND_PREFIX}{run_id}.{r}/{_ROLE_INFO_OF_RANK_0}"]))

        low = max(0, int(env.get("TORCHELASTIC_RESTART_COUNT") or 0))
        if not formed(low):
            raise LookupError(f"no role info for round {low} (TORCH_ELASTIC_WORKER_IDENTICAL=1?)")
        step = 1
        while formed(low + step):
            low, step = low + step, 2 * step
        high = low + step  # ``low`` formed, ``high`` not: halve the gap
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if formed(middle) else (low, middle)
        return low
    except Exception as error:  # any failure: the attempt falls back, the job goes on
        raise RoundUnreadError(f"could not read the rendezvous round at {host}:{port} ({error})"[:300]) from None


def _rendezvous_of(arguments: list[str], env: Mapping[str, str]) -> tuple[str, int] | None:
    """The c10d rendezvous endpoint of a multi-node torchrun's command line, parsed by torchrun's own
    parser (which also reads the ``PET_*`` variables the agent's environment passed to this rank)."""
    if not any("c10d" in a for a in arguments) and env.get("PET_RDZV_BACKEND") != "c10d":
        return None  # torchrun's default backend is static: no parse, no import
    try:
        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()
        parser.error = _refuse  # type: ignore[method-assign]  # no usage text on the job's stderr, no exit
        parsed, _ = parser.parse_known_args(arguments)
        most = int(str(parsed.nnodes).rsplit(":", 1)[-1])
        if parsed.rdzv_backend != "c10d" or parsed.standalone or not parsed.rdzv_endpoint or most <= 1:
            return None
        host, port = parse_rendezvous_endpoint(parsed.rdzv_endpoint, default_port=29400)
        return None if port == 0 else (host, port)  # port 0: each launch its own store, on one node
    except Exception:  # a command torchrun's parser refuses: no round
        return None


def _refuse(message: str) -> NoReturn:
    raise ValueError(message)
