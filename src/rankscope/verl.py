"""``rankscope.verl``: verl's tracking backend; ``rankscope.verl.register`` is the string a job's Ray
``worker_process_setup_hook`` names (``rankscope.integrations.verl``)."""

from .integrations.verl import BACKEND, RankscopeVerlLogger, WorkerProcesses, register, workers

__all__ = ["BACKEND", "RankscopeVerlLogger", "WorkerProcesses", "register", "workers"]
