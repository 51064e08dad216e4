"""The ``torch_distributed`` instrumentor: torch.distributed's collectives under
``opentelemetry-instrument``. The wrappers, what they record and their one install per process
are ``tracing.collectives`` (DDP's bucket all-reduces routed through them: ``tracing.ddp``),
which ``rs.init`` installs too: either path first, the other finds
them installed and wraps nothing again; ``uninstrument`` puts the originals back.
"""

from __future__ import annotations

from types import ModuleType

from ..tracing import collectives, ddp
from ._base import ModuleInstrumentor


class CollectivesInstrumentor(ModuleInstrumentor):
    """Wraps the collectives in ``collectives.OPS`` on ``torch.distributed`` and ``distributed_c10d``."""

    target = "torch.distributed"

    def _apply(self, module: ModuleType) -> None:
        collectives.install(module)
        ddp.install(module)

    def _revert(self) -> None:
        collectives.uninstall()
        ddp.uninstall()
