"""``rankscope.torchtitan``: torchtitan's metrics processor and structured-logger handler;
``rankscope.torchtitan.register_handler`` is the string ``TITAN_STRUCT_LOGGER_HANDLERS`` names
(``rankscope.integrations.torchtitan``)."""

from .integrations.torchtitan import (
    REDUCES,
    RankscopeHandler,
    RankscopeLogger,
    RankscopeMetricsProcessor,
    follower,
    reduce_for,
    register_handler,
)

__all__ = [
    "REDUCES",
    "RankscopeHandler",
    "RankscopeLogger",
    "RankscopeMetricsProcessor",
    "follower",
    "reduce_for",
    "register_handler",
]
