"""``rankscope.huggingface``: Transformers' ``Trainer`` callback (``rankscope.integrations.huggingface``)."""

from .integrations.huggingface import RankscopeCallback

__all__ = ["RankscopeCallback"]
