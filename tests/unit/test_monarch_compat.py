"""Only ``integrations/monarch/_compat.py`` touches torchmonarch's private symbols (a source scan).

The patches coming off and the per-call context, in child processes, are ``tests/e2e/test_monarch_compat.py``."""

from __future__ import annotations

from ..conftest import ROOT


def test_only_compat_touches_monarch_internals() -> None:
    package = ROOT / "src" / "rankscope"
    touching = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if "monarch._src" in p.read_text()}
    assert touching == {"integrations/monarch/_compat.py"}


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




