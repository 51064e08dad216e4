"""What a rank can learn from the torchrun that started it: its agent's start time and command
(from ``/proc``), and the round of its c10d rendezvous (from the rendezvous store).

torchelastic's ``TORCHELASTIC_RESTART_COUNT`` counts the restarts of one node's agent: after a node
is lost, a node whose ranks failed counts one, a node whose ranks were still healthy (waiting in a
collective) restarts them for the membership change without counting. The rendezvous round is the
same on every node of a world and grows with every re-rendezvous, so the attempt comes from it.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

_log = logging.getLogger(__name__)

_COMMANDS = ("torch.distributed.run", "torch/distributed/run.py", "torchrun")
_STORE_TIMEOUT = timedelta(seconds=5)


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


def rendezvous_round(env: Mapping[str, str], proc: Path = Path("/proc")) -> int | None:
    """The round of the c10d rendezvous this rank's world was formed in, read from the rendezvous
    store with torch's own backend. None where there is none to read: not torchrun, a static or
    ``--standalone`` launch (one agent: its restart count is the world's), or the store out of
    reach (a warning: the attempt then falls back to this node's restart count)."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if not run_id or "torch" not in sys.modules:
        return None
    agent = find_agent(proc)
    rendezvous = None if agent is None else _rendezvous_of(agent.arguments, env)
    if rendezvous is None:
        return None
    host, port = rendezvous
    try:
        from torch.distributed import TCPStore
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

        store = TCPStore(host, port, is_master=False, timeout=_STORE_TIMEOUT)
        found = C10dRendezvousBackend(store, run_id).get_state()
        # The state is pickled by the agents of this very job: torch's backend reads it the same way.
        return None if found is None else int(pickle.loads(found[0]).round)
    except Exception as error:  # any failure: the attempt falls back, the job goes on
        _log.warning(
            "rankscope: could not read the rendezvous round at %s:%d (%s); the attempt is this node's "
            "restart count, which can differ between nodes after a node is lost",
            host,
            port,
            error,
        )
        return None


def _rendezvous_of(arguments: list[str], env: Mapping[str, str]) -> tuple[str, int] | None:
    """The c10d rendezvous endpoint of torchrun's command line, parsed by torchrun's own parser
    (which also reads the ``PET_*`` variables the agent's environment passed to this rank)."""
    if not any("c10d" in a for a in arguments) and env.get("PET_RDZV_BACKEND") != "c10d":
        return None  # torchrun's default backend is static: no parse, no import
    try:
        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
        from torch.distributed.run import parse_args

        parsed = parse_args(arguments)  # type: ignore[no-untyped-call]
        if parsed.rdzv_backend != "c10d" or parsed.standalone or not parsed.rdzv_endpoint:
            return None
        return parse_rendezvous_endpoint(parsed.rdzv_endpoint, default_port=29400)
    except (Exception, SystemExit):  # a command torchrun's parser refuses: no round
        return None
