"""A cluster on this box: "nodes" and a "service host" as network namespaces (issue 44).

Each namespace has its own loopback and one veth (``eth0``) whose peer is attached to a bridge in
the service host's namespace, on a private subnet that exists only inside these namespaces: the
host's network never sees their traffic, and a node is cut off by setting its veth down. Every
process started here runs in a namespace (``ip netns exec``) in its own process group; ``close``
kills whatever still runs in the namespaces and deletes them, even after a failed test.

TCP's retransmission backoff is capped at ``RTO_MAX_MS`` in every namespace, its retries raised to
match (where the kernel has ``tcp_rto_max_ms``, 6.15+): a link down for 30 s otherwise leaves a
connection's next retry up to ~25 s after the link is back, and the job's ranks finish the
all-reduce they waited in that far apart (measured: 54 s between two steps for a 30 s cut; 30.5 s
capped). The sink then rightly names healthy ranks missing at the step the job resumed (their data
comes late, docs/trouble.md); that is not these tests' subject.

Needs root and ``ip netns`` (``netns_refusal`` says why not, for a skip).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .pipeline import Process

SUBNET = "10.213.7"
"""The private /24: it exists only inside the cluster's namespaces (the host never routes it)."""
SERVICE_IP = f"{SUBNET}.1"
RTO_MAX_MS, RETRIES = 1000, 60
"""TCP's longest retransmission timeout inside the cluster (the kernel's default: 120 s), and the
retries before it gives a connection up (default 15: ~15 s at that cap, and the job dies in a 30 s cut)."""
RTO_MAX = Path("/proc/sys/net/ipv4/tcp_rto_max_ms")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def netns_refusal() -> str | None:
    """Why this box cannot build the cluster (not root, no ``ip``, namespaces refused), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"rsprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except FileNotFoundError:
        return "the ip command (iproute2) is not installed"
    except subprocess.CalledProcessError as exc:
        return f"ip netns add is refused here: {exc.stderr.strip()}"
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", probe)
    return None


@dataclass
class Host:
    """One namespace: a node or the service host."""

    name: str
    """The namespace's name."""
    ip: str
    peer: str
    """The service-side end of its veth (on the bridge); empty for the service host."""
    processes: list[Process] = field(default_factory=list)

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> Process:
        """``argv`` in this namespace, in a process group of its own, its output to ``log``."""
        process = Process(self.command(argv), env, log)
        self.processes.append(process)
        return process

    def run(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, check=False)

    def get(self, url: str, timeout: float = 10.0) -> str | None:
        """GET ``url`` from inside this namespace (the test itself runs outside it); None if no answer."""
        code = (
            "import sys, urllib.request\n"
            "try:\n"
            f"    sys.stdout.write(urllib.request.urlopen({url!r}, timeout={timeout}).read().decode())\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        done = self.run([sys.executable, "-c", code], timeout=timeout + 10)
        return done.stdout if done.returncode == 0 else None

    def get_json(self, url: str, timeout: float = 10.0) -> Any:
        """``get`` a JSON answer, decoded; None if no answer."""
        text = self.get(url, timeout)
        return json.loads(text) if text else None

    def kill_all(self) -> None:
        """SIGKILL every process in the namespace (the ones started here and any they started)."""
        found = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True, check=False)
        for pid in found.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        for process in self.processes:
            process.stop(signal.SIGKILL, timeout=5)


class Cluster:
    """``nodes`` node namespaces and a service host, joined by a bridge in the service host."""

    def __init__(self, nodes: int) -> None:
        tag = secrets.token_hex(3)
        self.service = Host(f"rs{tag}-svc", SERVICE_IP, "")
        self.nodes = [Host(f"rs{tag}-n{i}", f"{SUBNET}.{10 + i}", f"rs{tag}p{i}") for i in range(nodes)]

    def build(self) -> None:
        svc = self.service.name
        _ip("netns", "add", svc)
        self._cap_backoff(svc)
        _ip("-n", svc, "link", "set", "lo", "up")
        _ip("-n", svc, "link", "add", "br0", "type", "bridge")
        _ip("-n", svc, "addr", "add", f"{SERVICE_IP}/24", "dev", "br0")
        _ip("-n", svc, "link", "set", "br0", "up")
        for node in self.nodes:
            _ip("netns", "add", node.name)
            self._cap_backoff(node.name)
            _ip("-n", node.name, "link", "set", "lo", "up")
            # made inside the node's namespace, its peer moved to the service host's: never in the host's
            _ip("-n", node.name, "link", "add", "eth0", "type", "veth", "peer", "name", node.peer, "netns", svc)
            _ip("-n", node.name, "addr", "add", f"{node.ip}/24", "dev", "eth0")
            _ip("-n", node.name, "link", "set", "eth0", "up")
            _ip("-n", svc, "link", "set", node.peer, "master", "br0")
            _ip("-n", svc, "link", "set", node.peer, "up")

    @staticmethod
    def _cap_backoff(namespace: str) -> None:
        """``RTO_MAX_MS`` and ``RETRIES`` in ``namespace`` (per-namespace settings), where the kernel has the cap."""
        if RTO_MAX.exists():
            retries = RTO_MAX.with_name("tcp_retries2")
            command = f"echo {RETRIES} > {retries} && echo {RTO_MAX_MS} > {RTO_MAX}"
            with contextlib.suppress(subprocess.CalledProcessError):  # a read-only /proc/sys: uncapped, as before
                _ip("netns", "exec", namespace, "sh", "-c", command)

    def cut(self, node: Host, down: bool) -> None:
        """Set ``node``'s veth down (cut off from every other host) or up again."""
        _ip("-n", node.name, "link", "set", "eth0", "down" if down else "up")

    def blackhole(self, node: Host, ip: str, on: bool) -> None:
        """Drop everything ``node`` sends to ``ip`` (a route to nowhere), or route it again: a
        partition of one path (a node's telemetry to the service host) while the others work."""
        _ip("-n", node.name, "route", "add" if on else "del", "blackhole", f"{ip}/32")

    def close(self) -> None:
        for host in [*self.nodes, self.service]:
            host.kill_all()
        time.sleep(0.2)
        for host in [*self.nodes, self.service]:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", host.name)


@contextmanager
def cluster(nodes: int) -> Iterator[Cluster]:
    """A built cluster, torn down (processes killed, namespaces deleted) however the test ends."""
    made = Cluster(nodes)
    try:
        made.build()
        yield made
    finally:
        made.close()
