"""The unit tier: no network sockets, no subprocesses, no forks (threads are fine).

``pytest tests/unit`` is the inner loop, so what makes a test slow or machine-dependent is kept
out of it by construction: a test here that opens an IP socket, starts a gRPC server or channel,
or starts or forks a process fails, naming what it did, and belongs in ``tests/integration``.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest
import torch
from opentelemetry.exporter.otlp.proto.grpc import exporter as otlp_grpc_exporter

# torch.cuda loads lazily and looks for its libraries with ``ldconfig -p`` (a subprocess) on first
# use: done here, before any test, so a test that merely touches torch.cuda first is not refused.
torch.cuda.is_available()

_NETWORK_FIXTURES = {"receiver", "http_receiver", "make_sink", "binaries", "browser_ready"}


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a unit test {what}; it belongs in tests/integration")

    return refused


@pytest.fixture(autouse=True)
def no_network_or_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    used = _NETWORK_FIXTURES.intersection(request.fixturenames)
    if used:
        pytest.fail(f"a unit test uses {sorted(used)}; it belongs in tests/integration")
    opened = socket.socket.__init__

    def local_only(self: socket.socket, family: int = -1, *args: Any, **kwargs: Any) -> None:
        if family in (socket.AF_INET, socket.AF_INET6) or (family == -1 and not args and "fileno" not in kwargs):
            raise AssertionError("a unit test opened an IP socket; it belongs in tests/integration")
        opened(self, family, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "__init__", local_only)
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a subprocess"))
    # Below Popen: multiprocessing's spawn and forkserver start methods exec through this too.
    monkeypatch.setattr(_posixsubprocess, "fork_exec", _refuse("started a process"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        monkeypatch.setattr(os, name, _refuse(f"called os.{name}"))
    channels = ("insecure_channel", "secure_channel")
    gates = ((grpc, ("server", *channels)), (grpc.aio, ("server", *channels)), (otlp_grpc_exporter, channels))
    for module, names in gates:
        for name in names:
            monkeypatch.setattr(module, name, _refuse(f"opened a gRPC {name}"))
    yield
