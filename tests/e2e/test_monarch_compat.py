"""Patches on Monarch's private symbols that come off again, a moved symbol that turns its feature
off with one warning, and per-call caller context.

Monarch is only imported in child processes: once it is loaded, rankscope treats a process as part
of a Monarch job (no periodic exports, steps driven by the controller), which would change every
later test in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rankscope.sink import Sink

from ..conftest import ROOT, run_python

UNINSTRUMENT = """
import pickle
from monarch._src.actor import actor_mesh  # what a Monarch program loads
from rankscope.instrumentation import MonarchInstrumentor
from rankscope.integrations.monarch import propagation

def current():
    return (actor_mesh._check_endpoint_arguments, actor_mesh._create_endpoint_message, actor_mesh._Actor._lookup)

originals = current()
for _ in range(2):  # and instrumenting again works
    propagation.install_caller()  # what rs.init does in a Monarch program
    MonarchInstrumentor().instrument()
    pickle.loads(pickle.dumps(propagation.Carried(1, 2, True, 0, "c")))  # an incoming call: the callee side
    assert all(now is not before for now, before in zip(current(), originals)), "not patched"
    MonarchInstrumentor().uninstrument()
    left = [now.__qualname__ for now, before in zip(current(), originals) if now is not before]
    assert not left, f"still patched after uninstrument: {left}"
print("reverted")
"""


def test_uninstrument_puts_every_monarch_function_back() -> None:
    # A fresh interpreter: in this one an earlier test's rs.init may have patched Monarch already.
    result = run_python(UNINSTRUMENT)
    assert result.returncode == 0 and result.stdout.split() == ["reverted"], result.stderr[-3000:]


MOVED = """
import warnings
from monarch._src.actor import actor_mesh
from rankscope.integrations.monarch import _compat, propagation

original = actor_mesh._check_endpoint_arguments
del actor_mesh._create_endpoint_message  # a torchmonarch release that renamed it
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    propagation.install_caller()
    assert _compat.message_hooks() is None
assert actor_mesh._check_endpoint_arguments is original and _compat.patched() == []  # nothing half-patched
print(*[str(w.message) for w in seen], sep="\\n")
"""


def test_a_moved_monarch_symbol_turns_its_feature_off_with_one_warning() -> None:
    result = run_python(MOVED)
    assert result.returncode == 0, result.stderr[-3000:]
    (message,) = result.stdout.splitlines()
    assert message.startswith("rankscope: torchmonarch 0.7.0 has no actor_mesh._create_endpoint_message")
    assert "read from 0.7.0" in message and message.endswith("trace context and steps do not travel over Monarch calls")


def test_concurrent_endpoints_each_keep_their_callers_context(make_sink: Callable[..., Sink], tmp_path: Path) -> None:
    # The first call asks for server spans, the second does not; the actor runs both at once and
    # the first reads its context only after the second has entered its own (asyncio events, no
    # sleeps). With the caller's choice in a process global the first read the second's (False).
    sink = make_sink()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    worker = ROOT / "tests" / "workers" / "monarch_concurrent.py"
    result = subprocess.run(
        [sys.executable, str(worker), sink.endpoint], env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert json.loads(line) == {"first": True, "second": False}
