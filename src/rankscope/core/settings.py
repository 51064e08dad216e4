"""One table of settings: argument > ``RANKSCOPE_*`` > ``OTEL_*`` alias > default.

The table (``SETTINGS``) is the single source of truth: ``Settings.load`` builds the frozen,
validated settings of one ``init`` from it, ``resolve`` reads one setting for other callers
(the CLI, the distro, instrumentors, the embedded sink), and the docs' settings page is
generated from it (``docs/hooks.py``; ``rankscope settings`` prints it).

Every value goes through its setting's parser, whether it came from an argument or from the
environment: a parser takes the text of an environment variable or a typed argument and
returns the typed value, or raises ``ValueError``, which is re-raised naming the argument
(``export_interval=-1: ...``) or the variable (``RANKSCOPE_EXPORT_INTERVAL='-1': ...``).
So ``init(export_interval=-1)`` fails at the call like ``RANKSCOPE_EXPORT_INTERVAL=-1`` does,
instead of reaching the export thread as a negative timeout.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_bool(value: object) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case), or a bool (or the integer 0 or 1)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, Integral) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ValueError("must be true/false (1/0, yes/no, on/off)")


def _number(value: object) -> float:
    """A finite real number, from text or a number (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (str, Real)):
        raise ValueError("must be a number")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ValueError("must be a number") from None
    if not math.isfinite(number):
        raise ValueError("must be a finite number")
    return number


def _parse_positive_float(value: object) -> float:
    number = _number(value)
    if number <= 0:
        raise ValueError("must be a number > 0")
    return number


def _parse_ratio(value: object) -> float:
    number = _number(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError("must be between 0 and 1")
    return number


def _parse_positive_int(value: object) -> int:
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            raise ValueError("must be a whole number > 0") from None
    else:
        real = _number(value)
        if not real.is_integer():
            raise ValueError("must be a whole number > 0")
        number = int(real)
    if number <= 0:
        raise ValueError("must be a whole number > 0")
    return number


def _parse_text(value: object) -> str:
    """A string (an integer is taken as its decimal text: ``replica=1``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Integral) and not isinstance(value, bool):
        return str(int(value))
    raise ValueError("must be a string")


def _parse_backends(value: object) -> dict[str, dict[str, Any]]:
    shape = 'must be a JSON object like {"console": {"logging_mode": "global_reduce"}}'
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{shape} ({exc})") from None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in value.items()
    ):
        raise ValueError(shape)
    return {k: dict(v) for k, v in value.items()}


def _choice(*allowed: str) -> Callable[[object], str]:
    expected = ", ".join(map(repr, allowed[:-1])) + f" or {allowed[-1]!r}"

    def parse(value: object) -> str:
        word = value.strip().lower() if isinstance(value, str) else None
        if word is None or word not in allowed:
            raise ValueError(f"must be {expected}")
        return word

    return parse


def _parse_resume(value: object) -> str:
    """``latest`` (``True``, ``1``, ``yes``), a run id, or ``""`` for no resume (``False``, ``0``, ``no``)."""
    if value is True:
        return "latest"
    if value is False:
        return ""
    text = _parse_text(value).strip()
    word = text.lower()
    if word in ("1", "true", "yes", "on", "latest"):
        return "latest"
    return "" if word in ("", "0", "false", "no", "off") else text


def _parse_endpoint(value: object) -> str:
    """``host:port`` (plaintext) or an ``http://``/``https://`` URL: a typo (``localhost:43l7``,
    ``htp://...``) is refused here, before it reaches an exporter that reads it as something else."""
    text = _parse_text(value).strip()
    shape = "must be host:port (e.g. localhost:4317) or an http:// or https:// URL"
    url = text if "://" in text else f"http://{text}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port that is not a number in 0..65535
        if port == 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"{shape}; its port is not a number from 1 to 65535") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{shape}; {parts.scheme!r}:// is not a scheme rankscope exports to")
    if not parts.hostname:
        raise ValueError(f"{shape}; it names no host")
    if "://" not in text and port is None:
        raise ValueError(f"{shape}; it names no port")
    return text


_parse_sink = _choice("auto", "embedded", "off")
_parse_console = _choice("compact", "full", "off")
_parse_protocol = _choice("grpc", "http/protobuf")


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of the table. ``parse`` takes an environment variable's text or an argument's
    value and returns the typed value, or raises ``ValueError`` saying what is expected."""

    name: str
    env: str
    default: Any
    doc: str
    parse: Callable[[Any], Any] = _parse_text
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
        "run",
        "RANKSCOPE_RUN_ID",
        None,
        "Id of this launch (a run of the experiment), shared by its processes. Detected from the "
        "launcher (torchelastic's run id, the SLURM job and step) when unset; else "
        "generated by the first process and exported to the processes it starts.",
    ),
    Setting(
        "resume",
        "RANKSCOPE_RESUME",
        None,
        "Continue an earlier run of the experiment instead of starting a new one: `1` (its latest "
        "run) or a run id. Steps the resumed launch executes again replace the earlier ones.",
        _parse_resume,
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
        "OTLP endpoint of a sink or Collector (host:port, or an http:// or https:// URL; anything else "
        "is refused at init). Unset: the exporter honours OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT; if "
        "those are unset too, a multi-process job uses its embedded sink and a lone process keeps its views.",
        parse=_parse_endpoint,
    ),
    Setting(
        "protocol",
        "RANKSCOPE_PROTOCOL",
        "grpc",
        "OTLP transport: grpc or http/protobuf (an endpoint equal to RANKSCOPE_SINK_CONTROL, the sink's "
        "HTTP port as `rankscope run` sets it, is always sent http/protobuf).",
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
        "console",
        "RANKSCOPE_CONSOLE",
        "compact",
        "How a console view prints a step: compact (one line: your keys, the step time, the slowest "
        "process; anomalies one line per streak), full (every key, Forge's blocks) or off (nothing). "
        "A console view's `format` option overrides it. With no backends configured, a console view is on.",
        parse=_parse_console,
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
        "keep",
        "RANKSCOPE_KEEP",
        True,
        "Whether a job's own sink (the embedded one, `rankscope run`) keeps every run on disk: its "
        "report page and JSONL under rankscope_logs/EXPERIMENT/RUN/, beside whatever views it has, "
        "and prints `report: PATH` at the end. false/0/off: only the views configured.",
        parse=parse_bool,
    ),
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
        "collectives",
        "RANKSCOPE_COLLECTIVES",
        True,
        "init() instruments torch.distributed's collectives (spans: who arrived last, who waited) "
        "when torch is imported; OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=torch_distributed also turns it off.",
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
        "memory_history",
        "RANKSCOPE_MEMORY_HISTORY",
        None,
        "CUDA allocator events to keep in a ring (torch.cuda.memory history); on a CUDA OOM the "
        "process saves a memory snapshot (rankscope_artifacts/oom/). Unset: off.",
        parse=_parse_positive_int,
    ),
    Setting(
        "sample_seed",
        "RANKSCOPE_SAMPLE_SEED",
        None,
        "Seed of record_sample's random samples (tables without rank_by); each process mixes in its "
        "identity. Unset: a fresh random seed.",
        parse=_parse_positive_int,
    ),
    Setting(
        "sigterm",
        "RANKSCOPE_SIGTERM",
        True,
        "On SIGTERM (torchrun stops every rank when one fails), send what the process flushed and its "
        "goodbye (cut off at RANKSCOPE_SHUTDOWN_TIMEOUT + 1 s), then end as SIGTERM would; only where "
        "nothing else handles SIGTERM at the first init. 0: Python's default action.",
        parse=parse_bool,
    ),
    Setting(
        "shutdown_timeout",
        "RANKSCOPE_SHUTDOWN_TIMEOUT",
        2.0,
        "Seconds shutdown() waits to drain queued exports; the rest is counted as dropped. With a sink "
        "this job owns (embedded, `rankscope run`): counted from when it is up, and up to 30 s more "
        "while it is alive but busy.",
        parse=_parse_positive_float,
    ),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def _parsed(setting: Setting, value: Any, source: str) -> Any:
    try:
        return setting.parse(value)
    except ValueError as exc:
        raise ValueError(f"{source}={value!r}: {exc}") from None


def resolve(name: str, argument: Any = None, environ: Mapping[str, str] | None = None) -> Any:
    """One setting: ``argument`` when not None, else its variables, else the default.

    A bad value raises ``ValueError`` naming the argument (``export_interval=-1: ...``) or
    the variable (``RANKSCOPE_EXPORT_INTERVAL='-1': ...``). An empty variable counts as unset.
    """
    setting = _BY_NAME[name]
    if argument is not None:
        return _parsed(setting, argument, name)
    env = os.environ if environ is None else environ
    for var in (setting.env, *setting.otel_env):
        text = env.get(var)
        if text is not None and text.strip() != "":
            return _parsed(setting, text, var)
    return setting.default


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every setting of one ``init``, resolved once and validated (one field per row of ``SETTINGS``).

    Build it with ``Settings.load``; constructing or ``dataclasses.replace``-ing one runs every
    value through its parser again, so no instance holds an unchecked value.
    """

    experiment: str | None
    run: str | None
    resume: str | None
    role: str | None
    replica: str | None
    endpoint: str | None
    protocol: str
    backends: dict[str, dict[str, Any]] | None
    console: str
    sink: str
    sink_grace: float
    sink_control: str | None
    disable: bool
    keep: bool
    export_interval: float
    max_queued_steps: int
    trace_sample: float
    trace_root: bool | None
    max_queued_spans: int
    auto_step: bool
    collectives: bool
    grad_norm: bool
    host_metrics: bool
    memory_history: int | None
    sample_seed: int | None
    sigterm: bool
    shutdown_timeout: float

    def __post_init__(self) -> None:
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if value is not None or setting.default is not None:  # None means unset only where that is the default
                object.__setattr__(self, setting.name, _parsed(setting, value, setting.name))

    @classmethod
    def load(cls, arguments: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
        """Resolve every setting: ``arguments`` (None: not given) > ``RANKSCOPE_*`` > ``OTEL_*`` > default."""
        given = dict(arguments or {})
        unknown = given.keys() - _BY_NAME.keys()
        if unknown:
            raise TypeError(f"unknown rankscope setting(s): {', '.join(sorted(unknown))}")
        return cls(**{s.name: resolve(s.name, given.get(s.name), environ) for s in SETTINGS})


OTHER_VARIABLES: dict[str, str] = {
    "RANKSCOPE_SINK_TOKEN": "a sink's bearer token, and what a process sends it",
    "RANKSCOPE_SINK_TOKENS": "a shared sink's scoped tokens file",
    "RANKSCOPE_RUNTIME_DIR": "where a machine's sinks announce themselves",
    "RANKSCOPE_PARENT_RUN_ID": "the run a child launch belongs to",
    "RANKSCOPE_MERGE_INTERVAL": "the Collector configs' merge window",
    "RANKSCOPE_PER_RANK_KEYS": "the Collector configs' per-rank keys",
    "RANKSCOPE_SCRAPE_TARGET": "the Prometheus scrape config's target",
    "RANKSCOPE_SCRAPE_INTERVAL": "the Prometheus scrape config's interval",
    "RANKSCOPE_SCRAPE_PATH": "the Prometheus scrape config's path",
    "RANKSCOPE_EMPTY": "the Collector configs' empty string",
    "RANKSCOPE_SINK_ENDPOINT": "the Collector configs' sink",
    "RANKSCOPE_REMOTE_WRITE_URL": "the remote-write Collector config's Prometheus",
    "RANKSCOPE_SINK_BACKENDS": "docker-compose's sink views",
}
"""``RANKSCOPE_*`` variables that are not settings of a process and are read elsewhere: not unknown."""

TEST_VARIABLES = ("RANKSCOPE_CHROMIUM", "RANKSCOPE_CHROMEDRIVER", "RANKSCOPE_BIN_CACHE", "RANKSCOPE_TEST_ARTIFACTS")
"""Read by the test suite only."""


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """Each ``RANKSCOPE_*`` variable rankscope does not read, with the nearest known name when one
    is close (``RANKSCOPE_CONSOL`` -> ``RANKSCOPE_CONSOLE``): a typo is said, never ignored."""
    env = os.environ if environ is None else environ
    prefix = "RANKSCOPE_"
    known = {s.env for s in SETTINGS} | OTHER_VARIABLES.keys() | set(TEST_VARIABLES)
    tails = sorted(k.removeprefix(prefix) for k in known)  # the shared prefix would make any two alike
    out = []
    for name in sorted(env):
        if name.startswith(prefix) and name not in known:
            near = difflib.get_close_matches(name.removeprefix(prefix), tails, n=1, cutoff=0.75)
            out.append(f"{name} (did you mean {prefix}{near[0]}?)" if near else name)
    return out


def settings_markdown() -> str:
    rows = ["| setting | variable | OTel fallback | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        fallback = ", ".join(f"`{v}`" for v in s.otel_env) or "—"
        rows.append(f"| `{s.name}` | `{s.env}` | {fallback} | `{s.default}` | {s.doc} |")
    rows += ["", "Read elsewhere, not settings of a process:", "", "| variable | what |", "|---|---|"]
    rows += [f"| `{name}` | {what} |" for name, what in OTHER_VARIABLES.items()]
    return "\n".join(rows)
