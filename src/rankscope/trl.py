"""``rankscope.trl``: TRL's GRPOTrainer, ``rankscope.trl.instrument(trainer)`` (``rankscope.integrations.trl``)."""

from .integrations.trl import TABLE, RankscopeGRPOCallback, instrument

__all__ = ["TABLE", "RankscopeGRPOCallback", "instrument"]
