"""What the tests (and benchmarks) use of the sink's stages, in one place.

The stages under ``rankscope.sink`` move as the sink is re-laid; tests import them from here
(the OTel SDK keeps its stages in ``_internal`` behind small public modules the same way), so a
re-layout changes this module, not every test. Not a public API: no stability promised.
"""

from .book.admission import Admission, ExperimentLimits
from .book.counts import Counts
from .book.finalize import Finished, view_of
from .book.late import LateSteps
from .book.merge import holder, merge_rows, merge_state, reduced
from .book.outliers import judged_by, outliers
from .book.retained import HOT, Retained, Retention
from .book.roster import Roster
from .book.spread import Spread, spreads
from .book.step import Step
from .book.step_book import StepBook
from .book.steps import StepTable
from .book.stragglers import judge, record_of, straggler_metrics, stragglers
from .book.traces import MAX_QUERY_RANKS, SpanFile, StoredSpan, TraceStore, parse_ranks
from .book.windows import MAX_CLOCK_SKEW_NS, StepWindows
from .checked import (
    ALL,
    Limits,
    Process,
    Refusals,
    ResourceBatch,
    Scope,
    SpanQuery,
    StateRows,
    check_span,
    span_attributes,
    span_text,
)
from .config import RunLimits
from .durable.descriptors import RETAKEN, SPARE, Descriptors, Plan, out_of_descriptors
from .durable.kept import KeptFile
from .durable.retired import RetiredStore
from .durable.wal import (
    HEADER,
    JOURNAL,
    ExperimentLog,
    StateDirBusyError,
    WriteAheadLog,
    atomic_write,
    decode_record,
    encode_record,
)
from .edge.auth import Keys, authorized, load_tokens
from .edge.backlog import Backlog
from .edge.bodies import decode_body, hex_ids_to_base64
from .edge.connections import ConnectionServer, QuietLog
from .edge.control import ControlRoutes, scoped
from .edge.cost import RECORD_WEIGHT
from .edge.errors import ANSWERS, HttpError, Kind, OverloadedError, Refusal, RefusedError
from .edge.gate import Gate
from .edge.grpc_server import abort
from .edge.http_server import error_response
from .edge.listener import Listener
from .edge.ports import Client, Control
from .edge.validate import logs_batches, metrics_batches, traces_parts
from .embedded import announce, discover, runtime_dir, withdraw
from .runs.disk import Claim, DiskBudget, size_of
from .runs.opening import Openings
from .runs.quotas import Quotas
from .runs.runbook import Refused, Resolved, Retried, Run, RunBook
from .runs.upkeep import ENDED_MARGIN, Agenda
from .tally import Notes, kind_of
from .views.anomalies import DETECTORS, Watch
from .views.captures import CaptureBook, ask_outliers
from .views.detectors.base import StepFacts, Thresholds
from .views.fair import FairLine
from .views.step import StepView
from .views.viewset import SaidLines
from .views.writer import ViewPool, ViewWriter

__all__ = [
    "ALL",
    "ANSWERS",
    "DETECTORS",
    "ENDED_MARGIN",
    "HEADER",
    "HOT",
    "JOURNAL",
    "MAX_CLOCK_SKEW_NS",
    "MAX_QUERY_RANKS",
    "RECORD_WEIGHT",
    "RETAKEN",
    "SPARE",
    "Admission",
    "Agenda",
    "Backlog",
    "CaptureBook",
    "Claim",
    "Client",
    "ConnectionServer",
    "Control",
    "ControlRoutes",
    "Counts",
    "Descriptors",
    "DiskBudget",
    "ExperimentLimits",
    "ExperimentLog",
    "FairLine",
    "Finished",
    "Gate",
    "HttpError",
    "KeptFile",
    "Keys",
    "Kind",
    "LateSteps",
    "Limits",
    "Listener",
    "Notes",
    "Openings",
    "OverloadedError",
    "Plan",
    "Process",
    "QuietLog",
    "Quotas",
    "Refusal",
    "Refusals",
    "Refused",
    "RefusedError",
    "Resolved",
    "ResourceBatch",
    "Retained",
    "Retention",
    "RetiredStore",
    "Retried",
    "Roster",
    "Run",
    "RunBook",
    "RunLimits",
    "SaidLines",
    "Scope",
    "SpanFile",
    "SpanQuery",
    "Spread",
    "StateDirBusyError",
    "StateRows",
    "Step",
    "StepBook",
    "StepFacts",
    "StepTable",
    "StepView",
    "StepWindows",
    "StoredSpan",
    "Thresholds",
    "TraceStore",
    "ViewPool",
    "ViewWriter",
    "Watch",
    "WriteAheadLog",
    "abort",
    "announce",
    "ask_outliers",
    "atomic_write",
    "authorized",
    "check_span",
    "decode_body",
    "decode_record",
    "discover",
    "encode_record",
    "error_response",
    "hex_ids_to_base64",
    "holder",
    "judge",
    "judged_by",
    "kind_of",
    "load_tokens",
    "logs_batches",
    "merge_rows",
    "merge_state",
    "metrics_batches",
    "out_of_descriptors",
    "outliers",
    "parse_ranks",
    "record_of",
    "reduced",
    "runtime_dir",
    "scoped",
    "size_of",
    "span_attributes",
    "span_text",
    "spreads",
    "straggler_metrics",
    "stragglers",
    "traces_parts",
    "view_of",
    "withdraw",
]
