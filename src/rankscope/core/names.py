"""The one place that knows rankscope's attribute and metric names.

Resource attributes say who a process is; data-point attributes say which step and
reduction a point belongs to; span, event and log-record attributes say what a span or a
sample row is. The sink decodes with the same constants, so a rename here is a wire-format
change. No other module spells a ``rankscope.*`` name (``tests/unit/test_wire_names.py``).
"""

from __future__ import annotations

NAMESPACE = "rankscope."  # every rankscope attribute name starts with it

# Resource attributes (strings unless noted).
EXPERIMENT_ID = "rankscope.experiment.id"
EXPERIMENT_ATTEMPT = "rankscope.experiment.attempt"  # int
ATTEMPT_FALLBACK = "rankscope.experiment.attempt_fallback"  # why the rendezvous round was not read (absent: it was)
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
PROCESS_PARENT_PID = "process.parent_pid"  # int, in a forked child: the pid it was forked from

# Data-point attributes.
STEP = "rankscope.step"  # int; absent on periodic exports of processes that never flush
REDUCE = "rankscope.reduce"  # the reduce type's name, e.g. "mean"
STATE_FIELD = "rankscope.state"  # for custom reduce types: which state field this point holds
EXTREME_RANK = "rankscope.extreme.rank"  # int, on a merged MAX/MIN state: the rank holding the extreme
EXTREME_LABEL = "rankscope.extreme.label"  # on a merged MAX/MIN state: that process's label
SUM_SQ = "rankscope.sum_sq"  # double, on a STD state's histogram point: the sum of squares
SPREAD_N = "rankscope.spread.n"  # int: processes in a merged MEAN/SUM/STD point's spread of their own values
SPREAD_MEAN = "rankscope.spread.mean"  # float: their mean
SPREAD_M2 = "rankscope.spread.m2"  # float: their sum of squared deviations from it
SPREAD_LOW = "rankscope.spread.low"  # float: the lowest process's value ...
SPREAD_LOW_RANK = "rankscope.spread.low.rank"  # int: ... its rank ...
SPREAD_LOW_LABEL = "rankscope.spread.low.label"  # str: ... and label
SPREAD_HIGH = "rankscope.spread.high"  # float: the highest's likewise
SPREAD_HIGH_RANK = "rankscope.spread.high.rank"
SPREAD_HIGH_LABEL = "rankscope.spread.high.label"

# On the resource of states merged by the Collector's rankscopemerge processor (bool): the
# resource is the merge, not a process; its contributors are named by their own flush markers.
MERGED = "rankscope.merged"
MERGE_WINDOW = "rankscope.merge.window"  # int, on such a resource: which window of its Collector it is
MERGE_PART = "rankscope.merge.part"  # str, on such a resource: "ranks" for the window's merged flush markers

# Metrics rankscope emits about itself.
FLUSH_MARKER = "rankscope.flush"  # one point per flush: "this process closed step N" (value: keys)
FLUSH_RANKS = "rankscope.flush.ranks"  # merged markers: "these ranks of one group closed step N" (value: ranks)
RANKS = "rankscope.ranks"  # str, on a merged marker: the ranks as ascending ranges, "0-7,9,12-15"
DROPPED_POINTS = "rankscope.dropped_points"  # points lost to a full queue or failed exports
GOODBYE = "rankscope.goodbye"  # sent once at shutdown: "stop waiting for my steps"
EXIT_ERROR = "rankscope.exit.error"  # on the goodbye of a process that an exception ended: "Type: message"
EXPECTED_PROCESSES = "rankscope.expected_processes"  # on a controller's flush marker: procs it flushed
DRIVEN = "rankscope.driven"  # on an actor's flush marker: its controller closed this step
STREAM_KEY = "rankscope.key"  # log-record attributes of streamed (per_rank_no_reduce) values
STREAM_VALUE = "rankscope.value"

# Log-record attributes of sample-table rows (``record_sample``; ``otlp/samples.py``).
SAMPLE_TABLE = "rankscope.sample.table"  # the row's table
SAMPLE_SIDE = "rankscope.sample.side"  # why the row travels: "top", "bottom", "both", "sample" or "stream"
SAMPLE_KEY = "rankscope.sample.key"  # double: its rank_by value, or its random priority
SAMPLE_SEQ = "rankscope.sample.seq"  # int: its order among the process's rows of the table
SAMPLE_RANK_BY = "rankscope.sample.rank_by"  # the field the table ranks by (absent when it samples)
SAMPLE_K = "rankscope.sample.k"  # int: rows the table keeps
POLICY_VERSION = "rankscope.policy_version"  # int: the policy version in effect when the row was recorded

# Span attributes.
CALLER = "rankscope.caller"  # the process label of the remote caller whose span is this span's parent
TIMER = "rankscope.timer"  # "gpu" on a span timed with CUDA events (its times are GPU times)
CPU_START = "rankscope.cpu.start_time_unix_nano"  # int, on a GPU-timed span: its CPU start
CPU_END = "rankscope.cpu.end_time_unix_nano"  # int, on a GPU-timed span: its CPU end
LINKS_DROPPED = "rankscope.links.dropped"  # int: links beyond the cap that were not added
MEMORY_PEAK_GB = "rankscope.memory.peak_gb"  # double, track_memory: CUDA's peak allocated at the end
MEMORY_PEAK_EXACT = "rankscope.memory.peak_exact"  # bool, track_memory: the span itself set that peak
MEMORY_DELTA_GB = "rankscope.memory.delta_gb"  # double, track_memory: allocated at the end minus the start
COMM_OP = "rankscope.comm.op"  # on a collective's span: the torch.distributed function
COMM_BYTES = "rankscope.comm.bytes"  # int: the bytes of its input tensors
COMM_GROUP_SIZE = "rankscope.comm.group_size"  # int: processes in its group
COMM_ASYNC = "rankscope.comm.async"  # bool: called with async_op=True
COMM_SOURCE = "rankscope.comm.source"  # str: "ddp" for a DDP bucket's (its reducer's hook, tracing.ddp)
COMM_GROUP = "rankscope.comm.group"  # str: its process group's name (the same on every member)
COMM_WAIT = "rankscope.comm.wait_s"  # float, set by the sink: seconds this rank waited for the last one
COMM_LAST = "rankscope.comm.arrived_last"  # bool, set by the sink: this rank arrived last
OPTIMIZER = "rankscope.optimizer"  # on an optimizer/step span: the optimizer's class name
CHECKPOINT_BYTES = "rankscope.checkpoint.bytes"  # int, on a checkpoint span: the bytes saved or loaded
ACTOR_CLASS = "rankscope.actor.class"  # on a Monarch endpoint's server span: the actor's class
ACTOR_ENDPOINT = "rankscope.actor.endpoint"  # the endpoint's name
ACTOR_COORDS = "rankscope.actor.coords"  # the callee's point in its mesh: "procs=1,hosts=0"

# A capture on anomaly, marked in its step's trace: a zero-length span of this name...
CAPTURE_EVENT = "rankscope.capture"
CAPTURE_ID = "rankscope.capture.id"  # ...with the capture's id
CAPTURE_FILE = "rankscope.capture.file"  # ...and its trace file's path under the sink's artifact directory

# Standard OpenTelemetry attributes of a failed span's "exception" event.
EXCEPTION_EVENT = "exception"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"

# Metrics the sink adds to an experiment's global view.
META_PREFIX = "rankscope/"  # every metric key the sink or a backend adds about the experiment itself
STRAGGLER_PREFIX = "straggler/"  # the sink's per-phase straggler views: straggler/{phase}/...
MISSING_PROCESSES = "rankscope/missing_processes"
LATE_POINTS = "rankscope/late_points"
INTERNAL_ERRORS = "rankscope/internal_errors"
NONFINITE_VALUES = "rankscope/nonfinite_values"
"""Process states of the step holding a NaN or infinite value (one per process and key)."""
BUCKET_TIME = "rankscope/time"
"""A time-bucketed step's start (Unix seconds): the x-axis of an experiment whose processes do not step."""

# Keys the W&B backend adds to its rows.
LATE_UPDATE = "rankscope/late_update"  # 1.0 on a row that updates an already logged step
CORRECTIONS = "rankscope/corrections"  # W&B run summary: the late updates logged (a step's correction each)
REWOUND_TO = "rankscope/rewound_to"  # on a rewound run's first row again: the step it went back to
LOG_ROWS_DROPPED = "rankscope/log_rows_dropped"  # log rows beyond max_log_rows, not in the logs Table

# Tags the MLflow view sets on the runs it makes (backends/mlflow/runs.py), beside the ids above.
MLFLOW_PROCESS_TAG = "rankscope.process"  # a child run's process label
MLFLOW_VIEW_TAG = "rankscope.view"  # "global" (the run) or "process" (a child run)

INSTRUMENTATION_SCOPE = "rankscope"


def mesh_rank(dim: str) -> str:
    return f"{MESH_PREFIX}{dim}.rank"


def mesh_size(dim: str) -> str:
    return f"{MESH_PREFIX}{dim}.size"
