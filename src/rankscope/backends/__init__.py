"""Local views: backends that run inside the process (the sink reuses the interface)."""

from .base import LoggerBackend, LoggingMode, Metric, get_backend_class, register_backend
from .console import ConsoleBackend
from .jsonl import JsonlBackend
from .tensorboard import TensorBoardBackend
from .wandb import WandbBackend

register_backend("console", ConsoleBackend)
register_backend("jsonl", JsonlBackend)
register_backend("tensorboard", TensorBoardBackend)
register_backend("wandb", WandbBackend)

__all__ = ["LoggerBackend", "LoggingMode", "Metric", "get_backend_class", "register_backend"]
