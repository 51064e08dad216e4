"""The rankscope sink: the OTLP receiver and per-experiment reducer (``rankscope sink``)."""

from .admission import ExperimentLimits
from .experiment import Experiment, Process, StepView
from .service import DEFAULT_BACKENDS, Sink, SinkConfig

__all__ = ["DEFAULT_BACKENDS", "Experiment", "ExperimentLimits", "Process", "Sink", "SinkConfig", "StepView"]
