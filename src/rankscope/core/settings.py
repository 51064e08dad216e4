"""One table of settings: argument > ``RANKSCOPE_*`` > ``OTEL_*`` alias > default.

The table is the single source of truth: ``resolve_settings`` reads it, and the README's
settings section is generated from it (``rankscope settings --markdown``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_TRUE = frozenset({"1", "true", "yes", "on"})


def parse_bool(text: str) -> bool:
    return text.strip().lower() in _TRUE


def _parse_positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"must be > 0, got {text!r}")
    return value


def _parse_ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be between 0 and 1")
    return value


def _parse_positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be > 0, got {text!r}")
    return value


def _parse_backends(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError('must be a JSON object like {"console": {"logging_mode": "global_reduce"}}')
    return value


def _parse_sink(text: str) -> str:
    value = text.strip().lower()
    if value not in ("auto", "embedded", "off"):
        raise ValueError(f"must be 'auto', 'embedded' or 'off', got {text!r}")
    return value


def _parse_protocol(text: str) -> str:
    value = text.strip().lower()
    if value not in ("grpc", "http/protobuf"):
        raise ValueError(f"must be 'grpc' or 'http/protobuf', got {text!r}")
    return value


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    env: str
    default: Any
    doc: str
    parse: Callable[[str], Any] = str
    otel_env: tuple[str, ...] = ()


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "experiment",
        "RANKSCOPE_EXPERIMENT",
        None,
        "Experiment id shared by every process of one job. Detected from torchelastic/SLURM "
        "when unset; a generated id is exported to child processes.",
    ),
    Setting(
        "role",
        "RANKSCOPE_ROLE",
        None,
        "What this process is: trainer, generator, replay_buffer, controller, ...",
        otel_env=("OTEL_SERVICE_NAME",),
    ),
    Setting("replica", "RANKSCOPE_REPLICA", None, "Replica index of this role (e.g. generator 1)."),
    Setting(
        "endpoint",
        "RANKSCOPE_ENDPOINT",
        None,
        "OTLP endpoint of a sink or Collector (host:port or URL). Unset: the exporter honours "
        "OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT; if those are unset too, metrics stay in the "
        "process (local backends only).",
    ),
    Setting(
        "protocol",
        "RANKSCOPE_PROTOCOL",
        "grpc",
        "OTLP transport: grpc or http/protobuf.",
        parse=_parse_protocol,
        otel_env=("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ),
    Setting(
        "backends",
        "RANKSCOPE_BACKENDS",
        None,
        'Views as JSON, e.g. {"wandb": {"logging_mode": "global_reduce"}}. init(backends=...) '
        "sets it for child processes.",
        parse=_parse_backends,
    ),
    Setting(
        "sink",
        "RANKSCOPE_SINK",
        "auto",
        "Embedded sink when no endpoint is set: auto (for multi-process jobs: torchrun ranks, "
        "Monarch), embedded (always), off (views stay in each process).",
        parse=_parse_sink,
    ),
    Setting(
        "sink_grace",
        "RANKSCOPE_SINK_GRACE",
        10.0,
        "Seconds a sink waits for the last processes of a step before finalizing it without them.",
        parse=_parse_positive_float,
    ),
    Setting(
        "sink_control",
        "RANKSCOPE_SINK_CONTROL",
        None,
        "HTTP URL of a rankscope sink that takes this experiment's views (set by `rankscope run`).",
    ),
    Setting("disable", "RANKSCOPE_DISABLE", False, "true/1/yes: every rankscope call is a no-op.", parse=parse_bool),
    Setting(
        "export_interval",
        "RANKSCOPE_EXPORT_INTERVAL",
        1.0,
        "Seconds between periodic exports for processes that never call flush().",
        parse=_parse_positive_float,
    ),
    Setting(
        "max_queued_steps",
        "RANKSCOPE_MAX_QUEUED_STEPS",
        300,
        "Flushed steps held for export, also while the endpoint is unreachable (they go out when it "
        "answers); beyond this, new steps are dropped and counted. 300: five minutes at one step per second.",
        parse=_parse_positive_int,
    ),
    Setting(
        "trace_sample",
        "RANKSCOPE_TRACE_SAMPLE",
        1.0,
        "Fraction of steps whose spans are kept (0..1). Decided from the step's trace id, so every "
        "rank keeps or drops the same steps; duration metrics are always recorded.",
        parse=_parse_ratio,
    ),
    Setting(
        "trace_root",
        "RANKSCOPE_TRACE_ROOT",
        None,
        "true/false: whether this process emits each step's root span. Unset: a Monarch controller "
        "does, actors do not, otherwise rank 0 of role trainer/main/controller.",
        parse=parse_bool,
    ),
    Setting(
        "max_queued_spans",
        "RANKSCOPE_MAX_QUEUED_SPANS",
        65536,
        "Finished spans waiting for export before new ones are dropped (and counted).",
        parse=_parse_positive_int,
    ),
    Setting(
        "auto_step",
        "RANKSCOPE_AUTO_STEP",
        True,
        "Instrumented jobs that never call init()/flush(): each optimizer.step() closes a step.",
        parse=parse_bool,
    ),
    Setting(
        "grad_norm",
        "RANKSCOPE_GRAD_NORM",
        False,
        "Optimizer instrumentation also records the gradient norm (costs a reduction per step).",
        parse=parse_bool,
    ),
    Setting(
        "host_metrics",
        "RANKSCOPE_HOST_METRICS",
        False,
        "Memory instrumentation also records host RSS and CPU utilization at each flush.",
        parse=parse_bool,
    ),
    Setting(
        "shutdown_timeout",
        "RANKSCOPE_SHUTDOWN_TIMEOUT",
        5.0,
        "Seconds shutdown() waits to drain queued exports; the rest is counted as dropped.",
        parse=_parse_positive_float,
    ),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def resolve(name: str, argument: Any = None, environ: Mapping[str, str] | None = None) -> Any:
    """Resolve one setting; a bad environment value raises ``ValueError`` naming the variable."""
    setting = _BY_NAME[name]
    if argument is not None:
        return argument
    env = os.environ if environ is None else environ
    for var in (setting.env, *setting.otel_env):
        text = env.get(var)
        if text is not None and text.strip() != "":
            try:
                return setting.parse(text)
            except ValueError as exc:
                raise ValueError(f"{var}={text!r}: {exc}") from None
    return setting.default


def settings_markdown() -> str:
    rows = ["| setting | variable | OTel fallback | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        fallback = ", ".join(f"`{v}`" for v in s.otel_env) or "—"
        rows.append(f"| `{s.name}` | `{s.env}` | {fallback} | `{s.default}` | {s.doc} |")
    return "\n".join(rows)
