"""The rankscope sink: the OTLP receiver and per-experiment reducer (``rankscope sink``).

Folders by the order a request takes: ``edge`` (transports, control routes, checks, the ports),
``runs`` (a run's life: which run data goes to, opening, quotas, upkeep, closing), ``book`` (one
run's step book), ``durable`` (the write-ahead log and replay), ``views`` (the detectors,
captures, the view writer); the coordinator (``service``) and its parts (``config``, ``queries``,
``commands``, ``tally``) on top, ``checked`` (the data every stage shares) below. Tests reach the
stages through ``testing``.
"""

from .book.admission import ExperimentLimits
from .book.config import BookConfig
from .book.step_book import StepBook
from .checked import Limits, Process
from .config import DEFAULT_BACKENDS, KEPT_BACKENDS, REPORT_VIEW, DiskLimits, RunLimits, SinkConfig
from .edge.ports import Transport
from .service import Sink
from .views.detectors.base import Thresholds
from .views.step import StepView

__all__ = [
    "DEFAULT_BACKENDS",
    "KEPT_BACKENDS",
    "REPORT_VIEW",
    "BookConfig",
    "DiskLimits",
    "ExperimentLimits",
    "Limits",
    "Process",
    "RunLimits",
    "Sink",
    "SinkConfig",
    "StepBook",
    "StepView",
    "Thresholds",
    "Transport",
]
