"""Assembling a process's runtime: ``init``, and auto-init at first use.

``init`` resolves its arguments and the environment into one validated ``Settings`` (a bad
value raises before anything changes), then builds the Resource, the hot path's ``Recorder``,
the ``StepClock``, the tracing state, the process's ``Sender`` and views and the export thread,
wraps them in one ``Runtime`` (``driving``) and installs it in the runtime slot
(``core.runtime``), where every lower stage finds it. The first ``init`` of a process (also
the one auto-init runs) registers the process's at-fork and at-exit hooks; importing
rankscope registers nothing. A forked child's first call re-arms it instead (``fork.rearm``,
with this module's ``_start_runtime``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource

from ..backends.base import LoggerBackend, LoggingMode, check_views, make_view
from ..backends.console import printable, write_line
from ..core import names as attr
from ..core import runtime as _slot
from ..core.errors import report_internal_error, warn, warn_once
from ..core.identity import build_resource, process_label
from ..core.paths import safe_component as _component
from ..core.policy_version import policy_version_in_effect
from ..core.settings import Settings, resolve, unknown_variables
from ..export.captures import Captures
from ..export.local_views import BackendSet
from ..export.senders import (
    EmbeddedSender,
    RelaySender,
    Sender,
    has_endpoint,
    is_sink_http_port,
    make_sender,
    post_config,
)
from ..export.thread import ExportThread
from ..metrics.recorder import Recorder
from ..metrics.recording import bind_compile_check
from ..metrics.samples import Provenance
from ..steps.clock import StepClock
from ..tracing import collectives, ddp
from ..tracing.provider import install_tracer_provider
from ..tracing.tracer import TracingState, record_event
from .driving import Runtime, installed, started
from .fork import rearm, register_fork_hooks
from .shutdown import register_exit_hooks, shutdown_locked
from .state import process
from .stopping import take_sigterm


def init(
    *,
    experiment: str | None = None,
    role: str | None = None,
    backends: Mapping[str, Mapping[str, Any]] | None = None,
    endpoint: str | None = None,
    replica: str | int | None = None,
    mesh: Any = None,
    protocol: str | None = None,
    export_interval: float | None = None,
    disable: bool | None = None,
    resume: bool | str | None = None,
) -> Resource | None:
    """Configure rankscope for this process; optional (first use auto-initializes from env).

    The first call in a process registers its at-fork and at-exit hooks (``shutdown`` at exit);
    importing rankscope registers neither.

    Args:
        experiment: experiment id shared by all processes of the job (``RANKSCOPE_EXPERIMENT``).
        role: trainer, generator, replay_buffer, controller, ... (``RANKSCOPE_ROLE``).
        backends: local views, e.g. ``{"console": {"logging_mode": "per_rank_reduce"}}``
            (``RANKSCOPE_BACKENDS``). None: a console view, one line per step (``RANKSCOPE_CONSOLE``),
            where the views stay in the process, and the first rank says once where its metrics go.
        endpoint: OTLP endpoint of a sink or Collector, ``host:port`` or an ``http(s)://`` URL
            (``RANKSCOPE_ENDPOINT``).
        replica: replica index of this role (``RANKSCOPE_REPLICA``).
        mesh: a torch ``DeviceMesh``; each named dimension's rank and size join the Resource.
        protocol: ``grpc`` (default) or ``http/protobuf`` (``RANKSCOPE_PROTOCOL``); the sink's own
            HTTP port (an endpoint equal to ``RANKSCOPE_SINK_CONTROL``, as ``rankscope run`` sets) is
            always sent OTLP/HTTP.
        export_interval: seconds between periodic exports before the first flush
            (``RANKSCOPE_EXPORT_INTERVAL``).
        disable: make every call a no-op (``RANKSCOPE_DISABLE``).
        resume: continue an earlier run of the experiment instead of starting a new one: ``True``
            (its latest run) or a run id (``RANKSCOPE_RESUME``). Steps executed again replace
            the earlier ones in every view.

    Returns:
        The process Resource, or None when disabled. Calling init again reconfigures:
        values recorded so far are kept for the next flush. A program that calls init
        closes its own steps with ``flush``: instrumentors stop closing them (``auto_step``).

    Raises:
        ValueError: an argument or a ``RANKSCOPE_*``/``OTEL_*`` variable has a bad value (the
            message names it); nothing was changed.
    """
    with process.lock:
        _slot.ended = False
        if not process.notices.auto_initializing:  # what auto-init would have said is this init's to say now
            process.notices.unsaid_where = None
        if resolve("disable", disable):  # first: a disabled process is not held to its other settings
            shutdown_locked()
            _slot.install(None, off=True)
            return None
        settings = Settings.load(
            {
                "experiment": experiment,
                "role": role,
                "replica": replica,
                "endpoint": endpoint,
                "protocol": protocol,
                "backends": backends or None,  # an empty mapping: the variable's views, as before
                "export_interval": export_interval,
                "disable": disable,
                "resume": resume,
            }
        )
        _register_hooks()
        if settings.sigterm:
            take_sigterm()
        previous = installed()
        resource = build_resource(
            experiment=settings.experiment,
            role=settings.role,
            replica=settings.replica,
            mesh=mesh,
            resume=settings.resume,
        )
        label = process_label(resource.attributes)
        unknown = unknown_variables()
        if unknown and str(resource.attributes.get(attr.RANK, "0")) == "0":  # a typo said once, not per rank
            warn_once(f"rankscope: ignored: {', '.join(unknown)} (not a rankscope variable; see docs/settings.md)")
        experiment_id = str(resource.attributes[attr.EXPERIMENT_ID])
        views: dict[str, Any] = {k: dict(v) for k, v in (settings.backends or {}).items()}
        check_views(views)  # a misspelled view fails here, on every rank, not in the sink where no rank sees it
        stream = any(v.get("logging_mode") == LoggingMode.PER_RANK_NO_REDUCE.value for v in views.values())
        senders, views_in_sink = _make_senders(resource, settings, views)
        world = resource.attributes.get(attr.WORLD_SIZE)
        alone = world == "1" and senders is None
        if settings.backends is None and senders is None and settings.console != "off":
            # Nothing configured and the views stay here: something visible (a sink's default is its console too).
            mode = LoggingMode.GLOBAL_REDUCE if alone else LoggingMode.PER_RANK_REDUCE
            views = {"console": {"logging_mode": mode.value}}
        backend_objects = [] if views_in_sink else _make_backends(views, alone=alone)
        init_kwargs = {
            "rank": resource.attributes.get(attr.RANK),
            "world_size": world,
            "role": resource.attributes.get(attr.ROLE),
            "replica": resource.attributes.get(attr.REPLICA),
            "experiment": experiment_id,
            "run": resource.attributes.get(attr.RUN_ID),
        }
        backend_set = BackendSet(backend_objects, init_kwargs, label)
        monarch_controller = _is_monarch_controller()
        if previous is not None:  # re-init: stop the old export thread, keep what was recorded
            previous.recorder.on_take = None  # a periodic step waits for the new export thread
            shutdown_locked(drain_unflushed=False)
        runtime = _start_runtime(
            resource,
            settings,
            senders,
            backend_set,
            stream_to_sink=views_in_sink and stream,
            trace_root=_is_trace_root(resource, monarch_controller, settings.trace_root),
            # The recorder (values, key registry, device values, deferred GPU timings) and the
            # step clock outlive a re-init: a key keeps its reduce type, a step its number.
            recorder=None if previous is None else previous.recorder,
            steps=None if previous is None else previous.steps,
        )
        steps = runtime.steps
        steps.controller = monarch_controller
        steps.driven = "monarch" in sys.modules and not monarch_controller  # actors follow their controller
        steps.auto = False  # an explicit init: the program closes its own steps (_auto_init differs)
        # Children of this process (spawned workers, `rankscope run` commands) join this experiment.
        os.environ["RANKSCOPE_EXPERIMENT"] = experiment_id
        if attr.RUN_ID in resource.attributes:  # and this launch
            os.environ["RANKSCOPE_RUN_ID"] = str(resource.attributes[attr.RUN_ID])
        if attr.RUN_RESUME in resource.attributes:  # which continues that run, for every process of it
            os.environ["RANKSCOPE_RESUME"] = str(resource.attributes[attr.RUN_RESUME])
        if endpoint is not None:
            os.environ["RANKSCOPE_ENDPOINT"] = endpoint
        if backends is not None:
            os.environ["RANKSCOPE_BACKENDS"] = json.dumps(views)
        _slot.install(runtime)
        process.forks.origin = None  # a forked child that calls init is configured by it, not re-armed
        if settings.backends is None:
            _say_where(resource, settings, senders, views_in_sink, backend_objects)
        bind_compile_check()
        install_tracer_provider(resource)
        if "monarch" in sys.modules:
            _install_monarch_propagation()
        if settings.collectives and "torch.distributed" in sys.modules:
            _instrument_collectives()
        return resource


_WANDB_TOO = json.dumps({"console": {}, "wandb": {}})
"""The views the embedded sink's hint suggests: the console kept, W&B added."""
_FILES_TOO = json.dumps({"console": {}, "report": {}, "jsonl": {}})
"""The views a lone process's hint suggests: the console kept, the report and JSONL added."""


def _say_where(
    resource: Resource, settings: Settings, senders: Sender | None, in_sink: bool, views: list[LoggerBackend]
) -> None:
    """With nothing configured (no views, no endpoint), say where this process's metrics go: once,
    on stderr, from the first rank (again only if a later ``init`` sends them elsewhere: a launcher
    made it a rank). A process given an endpoint (``rankscope run`` sets one, and says where) knows."""
    a = resource.attributes
    embedded = in_sink and not settings.sink_control
    if str(a.get(attr.RANK, "0")) != "0" or (senders is not None and not embedded):
        return
    if embedded:
        where = "the experiment's embedded sink on this machine" + (
            ", which prints one line per step here" if settings.console != "off" else " (its console off)"
        )
        if settings.keep:  # the hint adds a view: the console stays, and the run is kept whatever the views
            directory = f"rankscope_logs/{_component(str(a[attr.EXPERIMENT_ID]))}/"
            wandb_too = _WANDB_TOO if settings.console != "off" else json.dumps({"wandb": {}})
            where += f" and keeps the run in {directory} (W&B too: RANKSCOPE_BACKENDS='{wandb_too}')"
        else:
            where += " and keeps nothing on disk (RANKSCOPE_KEEP=0)"
    elif views:
        where = f"this console, one line per step (files too: RANKSCOPE_BACKENDS='{_FILES_TOO}' or init(backends=...))"
    else:
        where = "nowhere: no view (RANKSCOPE_CONSOLE=off) and no endpoint"
    run = f" run {printable(a[attr.RUN_ID])}" if attr.RUN_ID in a else ""
    message = f"rankscope: experiment {printable(a[attr.EXPERIMENT_ID])}{run}: metrics -> {where}"
    notices = process.notices
    if notices.auto_initializing:  # said at the first flush: an init before it may name the experiment
        notices.unsaid_where = message
    elif message != notices.said_where:
        notices.said_where = message
        write_line(sys.stderr, message)


def follow_launcher() -> None:
    """Re-initialize when a framework's launcher made this process a rank of a multi-process job
    after rankscope started in it, so it reports its rank and joins the experiment's sink like a
    torchrun rank. Lightning's DDP launcher (``Trainer(strategy="ddp")`` under plain ``python``)
    sets ``WORLD_SIZE`` and ``LOCAL_RANK`` in the launching process itself, which becomes rank 0,
    and starts the other ranks; its logger and the Transformers callback call this at their first
    call (then ``torch.distributed`` says who the process is). Values recorded so far are kept."""
    runtime = installed()
    if runtime is None:
        return
    world, rank = _distributed()
    a = runtime.resource.attributes
    if world is None or world <= 1 or (a.get(attr.WORLD_SIZE), a.get(attr.RANK)) == (str(world), str(rank)):
        return
    with process.lock:
        if installed() is not runtime:
            return
        s = runtime.settings
        auto = runtime.steps.auto
        init(
            experiment=str(a[attr.EXPERIMENT_ID]),
            role=s.role,
            replica=s.replica,
            endpoint=s.endpoint,
            protocol=s.protocol,
            backends=s.backends,
            export_interval=s.export_interval,
            resume=s.resume or None,
        )
        followed = installed()
        if followed is not None:
            followed.steps.auto = auto  # an auto-initialized process keeps closing steps as it did


def _distributed() -> tuple[int | None, int | None]:
    """(world size, rank) of this process's ``torch.distributed`` group, (None, None) before it exists."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size()), int(dist.get_rank())
    except Exception:  # a half-torn-down group: nothing to follow
        pass
    return None, None


def _capture_event(name: str, attributes: dict[str, Any]) -> None:
    """A capture's mark in the step's trace (a zero-length span: every rank's timeline shows it)."""
    try:
        record_event(name, **attributes)
    except Exception as exc:
        report_internal_error("capture event", exc)


def _provenance(tracing: TracingState) -> Provenance:
    """A recorded row's stamp: now, the active span (else the step's root) and the policy version."""
    scope = tracing.scope()
    return Provenance(time.time_ns(), scope.trace_id, scope.parent_id, policy_version_in_effect())


def _start_runtime(
    resource: Resource,
    settings: Settings,
    senders: Sender | None,
    backend_set: BackendSet,
    *,
    stream_to_sink: bool,
    trace_root: bool,
    recorder: Recorder | None = None,
    steps: StepClock | None = None,
) -> Runtime:
    """A runtime for ``resource`` (init, re-init, or a forked child's re-arm)."""
    recorder = recorder or Recorder(streams=[])
    steps = steps or StepClock()
    tracing = TracingState(
        resource,
        steps,
        sample_ratio=settings.trace_sample if senders is not None else 0.0,  # spans need somewhere to go
        root=trace_root,
        max_spans=settings.max_queued_spans,
        on_error=report_internal_error,
    )
    a = resource.attributes
    process_id = str(a.get(attr.SERVICE_INSTANCE_ID) or a.get(attr.PROCESS_PID) or "?")
    captures = None
    if not isinstance(senders, RelaySender):  # forked children (DataLoader workers) are not profiled
        owned = senders if isinstance(senders, EmbeddedSender) else None
        captures = Captures(
            lambda: getattr(senders, "control_url", None) or settings.sink_control,
            str(a[attr.EXPERIMENT_ID]),
            process_id,
            on_event=_capture_event,
            label=process_label(a),
            control_coming=lambda: owned is not None and not owned.failed,  # the job's sink, not found yet
        )
    thread = ExportThread(
        resource=resource,
        recorder=recorder,
        backends=backend_set,
        sender=senders,
        captures=captures,
        stream_to_sink=stream_to_sink,
        export_interval=settings.export_interval,
        max_queued_steps=settings.max_queued_steps,
        periodic=lambda: steps.periodic,
        on_error=report_internal_error,
        spans=tracing.buffer,
        taken=tracing.taken,
        connect_at_start=not process.notices.auto_initializing,
    )
    runtime = Runtime(resource, settings, recorder, steps, thread, tracing)
    recorder.on_take = thread.submit  # periodic steps taken on the caller's thread
    if backend_set.streaming or thread.stream_to_sink:
        recorder.set_streams([lambda k, v, r, t: thread.stream(k, v, r, t, steps.current)])
        recorder.row_streams = [lambda table, row, origin: thread.stream_row(table, row, origin, steps.current)]
    else:
        recorder.set_streams([])
        recorder.row_streams = []
    recorder.provenance = functools.partial(_provenance, tracing)
    if settings.sample_seed is not None:  # reproducible, and different in every process
        recorder.rng.seed(f"{settings.sample_seed}/{process_label(resource.attributes)}")
    return runtime


def _is_trace_root(resource: Resource, monarch_controller: bool, explicit: bool | None) -> bool:
    """Whether this process emits each step's root span (exactly one process per experiment;
    ``explicit``: ``RANKSCOPE_TRACE_ROOT``)."""
    if explicit is not None:
        return bool(explicit)
    if monarch_controller:
        return True
    if "monarch" in sys.modules and not _is_monarch_controller():
        return False  # an actor process: its controller owns the step
    a = resource.attributes
    return str(a.get(attr.RANK)) == "0" and a.get(attr.ROLE) in ("trainer", "main", "controller")


def _instrument_collectives() -> None:
    """torch.distributed's collectives as spans, DDP's bucket all-reduces among them
    (``tracing.collectives`` and ``tracing.ddp``: the ``torch_distributed``
    instrumentor's wrappers, imported, so a process run from a source tree without installed entry
    points is instrumented too): the sink tells the rank that arrived last at each from the ranks
    that waited for it (``sink.book.stragglers``). Once per process, whichever of this and
    ``opentelemetry-instrument`` comes first."""
    disabled = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    if "torch_distributed" in {name.strip() for name in disabled.split(",")}:
        return
    try:
        collectives.install(sys.modules["torch.distributed"])
        ddp.install(sys.modules["torch.distributed"])
    except Exception as exc:
        report_internal_error("instrumenting torch.distributed's collectives", exc)


def _install_monarch_propagation() -> None:
    try:
        from ..integrations.monarch.propagation import install_caller  # torchmonarch is optional

        install_caller()
    except Exception as exc:
        report_internal_error("Monarch context propagation", exc)


def _make_senders(resource: Resource, settings: Settings, views: dict[str, Any]) -> tuple[Sender | None, bool]:
    """Where this process's OTLP goes, and whether its views run in that sink.

    An endpoint: export there; views run in the sink only when it takes posted configs
    (``rankscope run`` sets ``RANKSCOPE_SINK_CONTROL``, and the endpoint to that same HTTP port:
    OTLP/HTTP on one kept-alive connection, whatever the protocol setting says). No endpoint: a multi-process job
    (or ``RANKSCOPE_SINK=embedded``) uses its launch's embedded sink (one per experiment and
    run on this machine); a lone process keeps its views to itself.
    """
    experiment = str(resource.attributes[attr.EXPERIMENT_ID])
    endpoint, protocol, control = settings.endpoint, settings.protocol, settings.sink_control
    if has_endpoint(endpoint):
        if control is None:
            return make_sender(endpoint, protocol), False
        to = endpoint or ""
        if is_sink_http_port(endpoint, control):  # ``rankscope run``'s: OTLP/HTTP on one kept-alive connection
            protocol, to = "http/protobuf", control

        def post_then_send() -> tuple[str, str]:
            _post_views(control, experiment, views)
            return to, control

        return EmbeddedSender(post_then_send, protocol), True
    mode = settings.sink
    multi = resource.attributes.get(attr.WORLD_SIZE) != "1" or "monarch" in sys.modules
    if mode == "embedded" or (mode == "auto" and multi):

        def connect() -> tuple[str, str]:
            from ..sink.embedded import connect as connect_embedded  # the sink's servers load only when used

            run = str(resource.attributes.get(attr.RUN_ID) or "")
            notices = process.notices

            def started() -> None:
                notices.sink_starter = os.getpid()

            _, control = connect_embedded(experiment, run, on_start=started)
            _post_views(control, experiment, views)
            return control, control  # its HTTP port takes OTLP too

        # OTLP/HTTP on one kept-alive connection: ~0.6 ms of CPU a request against gRPC's ~1.3 (``kept_alive``)
        return EmbeddedSender(connect, "http/protobuf"), True
    return None, False


def _post_views(control: str, experiment: str, views: dict[str, Any]) -> None:
    if views:
        try:
            answer = post_config(control, experiment, views)
        except OSError as exc:
            answer = f"could not post: {exc}"
        if answer != "ok":
            warn(f"rankscope: the sink did not take this process's views ({answer})")


def _is_monarch_controller() -> bool:
    if "monarch" not in sys.modules:
        return False
    try:
        from ..integrations.monarch import actors as monarch
    except ImportError:
        return False
    return not monarch.in_actor()


def _make_backends(config: Mapping[str, Mapping[str, Any]], alone: bool) -> list[LoggerBackend]:
    made: list[LoggerBackend] = []
    for name, options in config.items():
        # Alone, its own view is the global one: a view naming no mode prints as a sink's would.
        backend = make_view(name, options, mode=LoggingMode.GLOBAL_REDUCE if alone else None)
        if backend.logging_mode is LoggingMode.GLOBAL_REDUCE and not alone:
            # Cross-process reduction belongs to the sink; a local copy would show one rank as "global".
            continue
        made.append(backend)
    return made


def _auto_init() -> Runtime | None:
    """First use without ``init``: start from the environment (the runtime slot's starter), or,
    in a forked child, re-arm as a process of the parent's experiment."""
    with process.lock:
        if process.exited:
            warn_once(
                "rankscope was called after its exit-time shutdown (from an exit handler registered "
                "before rs.init); not recorded"
            )
            return None
        origin = process.forks.origin
        if installed() is None and not _slot.disabled and origin is not None:
            try:
                _register_hooks()
                rearm(origin, _start_child_runtime)
            except Exception as exc:
                report_internal_error("re-arm after fork", exc)
            return installed()
        if installed() is None and not _slot.disabled:
            try:
                process.notices.auto_initializing = True
                try:
                    init()
                finally:
                    process.notices.auto_initializing = False
                runtime = installed()
                if runtime is not None:  # first use, no init(): instrumentors may close steps
                    runtime.steps.auto = runtime.settings.auto_step and not runtime.steps.driven
            except ValueError:
                raise  # a bad RANKSCOPE_*/OTEL_* value: the user must see it
            except Exception as exc:
                report_internal_error("auto-init", exc)
        return installed()


def _register_hooks() -> None:
    """The process's at-fork and at-exit hooks, registered by its first ``init`` (or re-arm),
    never by importing rankscope. Once registered they stay (an at-fork hook cannot be undone,
    and a forked child inherits both) and do nothing while no runtime is live."""
    register_fork_hooks()
    register_exit_hooks()


def _start_child_runtime(resource: Resource, settings: Settings, senders: RelaySender) -> Runtime:
    """A forked child's runtime: no views of its own, no root span; its requests go up ``senders``."""
    return _start_runtime(
        resource,
        settings,
        senders,
        BackendSet([], {}, process_label(resource.attributes)),
        stream_to_sink=False,
        trace_root=False,
    )


_slot.set_starter(_auto_init)


def get_resource() -> Resource | None:
    """This process's Resource (auto-initializing), or None when disabled."""
    runtime = started()
    return None if runtime is None else runtime.resource
