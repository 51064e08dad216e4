"""``rankscope.lightning``: PyTorch Lightning's logger (``rankscope.integrations.lightning``)."""

from .integrations.lightning import RankscopeLogger

__all__ = ["RankscopeLogger"]
