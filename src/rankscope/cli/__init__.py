"""The ``rankscope`` command: one module per subcommand; ``app.main`` builds the parser and dispatches."""

from .app import main

__all__ = ["main"]
