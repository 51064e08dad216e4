"""The rankscope sink: the OTLP receiver and per-experiment reducer (``rankscope sink``).

Folders by the order a request takes: ``edge`` (transports, control routes, checks, the ports),
``book`` (runs and the step book), ``durable`` (the write-ahead log and replay), ``views``
(anomalies, captures, the view writer); the coordinator (``service``) and its parts
(``config``, ``tenants``, ``quotas``, ``upkeep``, ``queries``, ``tally``) on top, ``checked`` (the data every stage
shares) below.
"""

from .book.admission import ExperimentLimits
from .book.experiment import Experiment
from .checked import Process
from .config import DEFAULT_BACKENDS, SinkConfig
from .quotas import RunLimits
from .service import Sink
from .views.step import StepView

__all__ = [
    "DEFAULT_BACKENDS",
    "Experiment",
    "ExperimentLimits",
    "Process",
    "RunLimits",
    "Sink",
    "SinkConfig",
    "StepView",
]
