"""Monarch actors: every endpoint call becomes a server span, child of the caller's span.

Context (trace, step, newest policy version) already travels with every call once rankscope
runs in the caller (``rankscope.integrations.monarch.propagation``). This instrumentor asks the callee
for more: a ``SERVER`` span ``Class.endpoint`` tagged with actor class, endpoint and mesh
coordinates, and per-endpoint ``endpoint/{Class}.{name}/{calls,latency_s,latency_max_s,failures}``
(``rankscope.integrations.monarch.endpoint_spans``). The actor's role and replica are in its process
Resource (the actor class and its mesh, see ``identity``).

A callee process that has no instrumentor of its own follows its callers' choice.

``uninstrument()`` puts back every Monarch function rankscope patched in this process, on the
caller side (the message hooks, including those ``rs.init`` installed for context propagation;
the next ``init`` installs them again) and on the callee side (``_Actor._lookup``), so Monarch
is as it was before rankscope touched it (``integrations.monarch._compat`` keeps the record).
"""

from __future__ import annotations

from types import ModuleType

from ..integrations.monarch import _compat, propagation
from ._base import ModuleInstrumentor


class MonarchInstrumentor(ModuleInstrumentor):
    target = _compat.ACTOR_MESH
    dependencies = ("torchmonarch >= 0.7",)

    def _apply(self, module: ModuleType) -> None:
        propagation.install_caller()
        propagation.server_spans = True

    def _revert(self) -> None:
        propagation.server_spans = False
        propagation.uninstall()
