"""The one place that knows rankscope's attribute and metric names.

Resource attributes say who a process is; data-point attributes say which step and
reduction a point belongs to. The sink decodes with the same constants, so a rename
here is a wire-format change.
"""

from __future__ import annotations

# Resource attributes (strings unless noted).
EXPERIMENT_ID = "rankscope.experiment.id"
EXPERIMENT_ATTEMPT = "rankscope.experiment.attempt"  # int
RUN_ID = "rankscope.run.id"  # one launch of the experiment: an experiment groups runs
RUN_RESUME = "rankscope.run.resume"  # "latest" or a run id: this launch continues that run
ROLE = "rankscope.role"
REPLICA = "rankscope.replica"
RANK = "rankscope.rank"
LOCAL_RANK = "rankscope.local_rank"
WORLD_SIZE = "rankscope.world_size"
MESH_PREFIX = "rankscope.mesh."

# Standard OpenTelemetry resource attributes we fill in.
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"

# Data-point attributes.
STEP = "rankscope.step"  # int; absent on periodic exports of processes that never flush
REDUCE = "rankscope.reduce"  # the reduce type's name, e.g. "mean"
STATE_FIELD = "rankscope.state"  # for custom reduce types: which state field this point holds
EXTREME_RANK = "rankscope.extreme.rank"  # int, on a merged MAX/MIN state: the rank holding the extreme
EXTREME_LABEL = "rankscope.extreme.label"  # on a merged MAX/MIN state: that process's label
SUM_SQ = "rankscope.sum_sq"  # double, on a STD state's histogram point: the sum of squares

# On the resource of states merged by the Collector's rankscopemerge processor (bool): the
# resource is the merge, not a process; its contributors are named by their own flush markers.
MERGED = "rankscope.merged"
MERGE_WINDOW = "rankscope.merge.window"  # int, on such a resource: which window of its Collector it is

# Metrics rankscope emits about itself.
FLUSH_MARKER = "rankscope.flush"  # one point per flush: "this process closed step N" (value: keys)
DROPPED_POINTS = "rankscope.dropped_points"  # points lost to a full queue or failed exports
GOODBYE = "rankscope.goodbye"  # sent once at shutdown: "stop waiting for my steps"
EXPECTED_PROCESSES = "rankscope.expected_processes"  # on a controller's flush marker: procs it flushed
DRIVEN = "rankscope.driven"  # on an actor's flush marker: its controller closed this step
STREAM_KEY = "rankscope.key"  # log-record attributes of streamed (per_rank_no_reduce) values
STREAM_VALUE = "rankscope.value"

# Metrics the sink adds to an experiment's global view.
MISSING_PROCESSES = "rankscope/missing_processes"
LATE_POINTS = "rankscope/late_points"
INTERNAL_ERRORS = "rankscope/internal_errors"
NONFINITE_VALUES = "rankscope/nonfinite_values"
"""Process states of the step holding a NaN or infinite value (one per process and key)."""
BUCKET_TIME = "rankscope/time"
"""A time-bucketed step's start (Unix seconds): the x-axis of an experiment whose processes do not step."""

INSTRUMENTATION_SCOPE = "rankscope"


def mesh_rank(dim: str) -> str:
    return f"{MESH_PREFIX}{dim}.rank"


def mesh_size(dim: str) -> str:
    return f"{MESH_PREFIX}{dim}.size"
