"""Assembles a process's runtime and takes it down: init, shutdown, auto-init, fork.

``init`` resolves its arguments and the environment into one validated ``Settings`` (a bad
value raises before anything changes), then builds the Resource, the hot path's ``Recorder``,
the ``StepClock``, the tracing state and the export thread, wraps them in one ``Runtime`` and
installs it in the runtime slot (``core.runtime``), where every lower layer finds it. Closing
a step (``Runtime.close``) is here too, because it touches all of them: flush hooks, the
recorder's hand-off, the step clock, the step's root span, a Monarch controller's fan-out and
the export queue.
"""

from __future__ import annotations

import atexit
import functools
import json
import mmap
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.resources import Resource

from .backends.base import LoggerBackend, LoggingMode, get_backend_class
from .core import names as attr
from .core import runtime as _slot
from .core.errors import report_internal_error, warn
from .core.identity import build_resource, process_label
from .core.policy_version import policy_version_in_effect
from .core.settings import Settings, resolve
from .export.captures import Captures
from .export.local_views import BackendSet
from .export.senders import (
    EmbeddedSender,
    ForkRelay,
    RelaySender,
    Sender,
    fork_pair,
    has_endpoint,
    make_sender,
    post_config,
    request_report,
    sink_status,
)
from .export.thread import ExportThread
from .metrics import rates
from .metrics.recorder import Recorder, StepBatch
from .metrics.recording import bind_compile_check, flush_hooks, run_flush_hooks
from .metrics.samples import Provenance
from .steps.clock import StepClock
from .tracing.provider import install_tracer_provider
from .tracing.tracer import TracingState, record_event

_lock = threading.RLock()


class Runtime:
    """One initialized rankscope in one process (installed in ``core.runtime``)."""

    def __init__(
        self,
        resource: Resource,
        settings: Settings,
        recorder: Recorder,
        steps: StepClock,
        thread: ExportThread,
        tracing: TracingState,
    ):
        self.resource = resource
        self.settings = settings
        self.recorder = recorder
        self.steps = steps
        self.tracing = tracing
        self.thread = thread

    @property
    def shutdown_timeout(self) -> float:
        return self.settings.shutdown_timeout

    def close(self, step: int, driven: bool, auto: bool = False) -> None:
        """Close ``step`` on this process (``flush``, a controller's flush, an automatic step)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TypeError(f"flush(step): step must be a non-negative int, got {step!r}")
        steps = self.steps
        if not auto:
            steps.auto = steps.auto_pending = False
        bind_compile_check()
        if flush_hooks:
            run_flush_hooks()
        captures = self.thread.captures
        if captures is not None:  # a profiler capture starts, steps or stops here (idle: one check)
            captures.at_flush(step)
        batch = self.recorder.take(step)
        steps.close(step)
        asked = 0
        if steps.controller:
            try:
                from .integrations.monarch.actors import flush_actors  # only a Monarch program gets here

                asked = flush_actors(step)
            except Exception as exc:
                report_internal_error("Monarch actor flush", exc)
        for fan_out in _fan_outs:
            try:
                asked += fan_out(step)
            except Exception as exc:
                report_internal_error("driven processes' flush", exc)
        root_span = self.tracing.closed()  # the span itself is made on the export thread
        if batch is not None:
            if asked:
                batch.expected = asked + 1
            batch.root_span = root_span
            batch.driven = driven
            self.thread.submit(batch)

    def flush_driven(self, step: int) -> None:
        """``flush`` sent by a Monarch controller to its actor processes.

        It may arrive after an endpoint call of a later step already closed ``step`` here
        (``catch_up``): then it is a no-op, or only the step's marker when catching up skipped it.
        """
        steps = self.steps
        if steps.last is not None and step <= steps.last:
            if step not in steps.closed:
                steps.closed.add(step)
                now = time.time_ns()
                self.thread.submit(StepBatch(step, now, now, {}, None, driven=True))
            return
        self.close(step, driven=True)

    def catch_up(self, step: int) -> None:
        """An endpoint call of the controller's step ``step`` arrived in this actor process: close
        the step before it first if the controller's ``flush`` has not arrived yet (Monarch orders
        it only after the replies the controller awaited, not before its next calls), so what the
        call records lands in ``step`` exactly."""
        steps = self.steps
        if steps.driven and step > 0 and (steps.last is None or steps.last < step - 1):
            self.close(step - 1, driven=True)

    def auto_step(self) -> None:
        """An instrumentor saw a training step end (an optimizer step): it will be closed as the
        next step, unless the program closes steps itself (it calls ``flush``) or a Monarch
        controller does.

        The close waits for the next instrumented event (``settle_auto_step``) or shutdown: a
        program that calls ``flush`` right after ``optimizer.step()`` gets there first, and its
        own step numbers win without a duplicate step.
        """
        if self.steps.auto:
            self.steps.auto_pending = True

    def settle_auto_step(self) -> None:
        """Close the step ``auto_step`` left pending (instrumentors call this before recording)."""
        steps = self.steps
        if steps.auto_pending:
            steps.auto_pending = False
            if steps.auto:
                self.close(steps.next, driven=False, auto=True)


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

    Args:
        experiment: experiment id shared by all processes of the job (``RANKSCOPE_EXPERIMENT``).
        role: trainer, generator, replay_buffer, controller, ... (``RANKSCOPE_ROLE``).
        backends: local views, e.g. ``{"console": {"logging_mode": "per_rank_reduce"}}``.
        endpoint: OTLP endpoint of a sink or Collector (``RANKSCOPE_ENDPOINT``).
        replica: replica index of this role (``RANKSCOPE_REPLICA``).
        mesh: a torch ``DeviceMesh``; each named dimension's rank and size join the Resource.
        protocol: ``grpc`` (default) or ``http/protobuf`` (``RANKSCOPE_PROTOCOL``).
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
    global _fork_origin
    with _lock:
        if resolve("disable", disable):  # first: a disabled process is not held to its other settings
            _shutdown_locked()
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
        previous = _slot.current
        resource = build_resource(
            experiment=settings.experiment,
            role=settings.role,
            replica=settings.replica,
            mesh=mesh,
            resume=settings.resume,
        )
        label = process_label(resource.attributes)
        experiment_id = str(resource.attributes[attr.EXPERIMENT_ID])
        views: dict[str, Any] = {k: dict(v) for k, v in (settings.backends or {}).items()}
        stream = any(v.get("logging_mode") == LoggingMode.PER_RANK_NO_REDUCE.value for v in views.values())
        senders, views_in_sink = _make_senders(resource, settings, views)
        world = resource.attributes.get(attr.WORLD_SIZE)
        backend_objects = [] if views_in_sink else _make_backends(views, alone=world == "1" and senders is None)
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
            _shutdown_locked(drain_unflushed=False)
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
        _fork_origin = None
        bind_compile_check()
        install_tracer_provider(resource)
        _finalize_in_multiprocessing_child()
        if "monarch" in sys.modules:
            _install_monarch_propagation()
        return resource


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
        captures = Captures(
            lambda: getattr(senders, "control_url", None) or settings.sink_control,
            str(a[attr.EXPERIMENT_ID]),
            process_id,
            on_event=_capture_event,
            label=process_label(a),
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
        periodic=lambda: not steps.flushed and not steps.monarch,
        on_error=report_internal_error,
        spans=tracing.buffer,
        taken=tracing.taken,
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


def _install_monarch_propagation() -> None:
    try:
        from .integrations.monarch.propagation import install_caller  # torchmonarch is optional

        install_caller()
    except Exception as exc:
        report_internal_error("Monarch context propagation", exc)


def _make_senders(resource: Resource, settings: Settings, views: dict[str, Any]) -> tuple[Sender | None, bool]:
    """Where this process's OTLP goes, and whether its views run in that sink.

    An endpoint: export there; views run in the sink only when it takes posted configs
    (``rankscope run`` sets ``RANKSCOPE_SINK_CONTROL``). No endpoint: a multi-process job
    (or ``RANKSCOPE_SINK=embedded``) uses the experiment's embedded sink; a lone process
    keeps its views to itself.
    """
    experiment = str(resource.attributes[attr.EXPERIMENT_ID])
    endpoint, protocol, control = settings.endpoint, settings.protocol, settings.sink_control
    if has_endpoint(endpoint):
        if control is None:
            return make_sender(endpoint, protocol), False

        def post_then_send() -> tuple[str, str]:
            _post_views(control, experiment, views)
            return endpoint or "", control

        return EmbeddedSender(post_then_send, protocol), True
    mode = settings.sink
    multi = resource.attributes.get(attr.WORLD_SIZE) != "1" or "monarch" in sys.modules
    if mode == "embedded" or (mode == "auto" and multi):

        def connect() -> tuple[str, str]:
            from .sink.embedded import connect as connect_embedded  # the sink's servers load only when used

            found = connect_embedded(experiment)
            _post_views(found[1], experiment, views)
            return found

        return EmbeddedSender(connect, "grpc"), True
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
        from .integrations.monarch import actors as monarch
    except ImportError:
        return False
    return not monarch.in_actor()


def _make_backends(config: Mapping[str, Mapping[str, Any]], alone: bool) -> list[LoggerBackend]:
    made: list[LoggerBackend] = []
    for name, options in config.items():
        backend = get_backend_class(str(options.get("backend", name)))(dict(options))
        if backend.logging_mode is LoggingMode.GLOBAL_REDUCE and not alone:
            # Cross-process reduction belongs to the sink; a local copy would show one rank as "global".
            continue
        made.append(backend)
    return made


def _auto_init() -> Runtime | None:
    """First use without ``init``: start from the environment (the runtime slot's starter)."""
    with _lock:
        if _slot.current is None and not _slot.disabled and _fork_origin is not None:
            try:
                _rearm_forked_child(_fork_origin)
            except Exception as exc:
                report_internal_error("re-arm after fork", exc)
            return _slot.current
        if _slot.current is None and not _slot.disabled:
            try:
                init()
                runtime = _slot.current
                if runtime is not None:  # first use, no init(): instrumentors may close steps
                    runtime.steps.auto = runtime.settings.auto_step and not runtime.steps.driven
            except ValueError:
                raise  # a bad RANKSCOPE_*/OTEL_* value: the user must see it
            except Exception as exc:
                report_internal_error("auto-init", exc)
        return _slot.current


_slot.set_starter(_auto_init)


_fan_outs: list[Callable[[int], int]] = []


def drive_processes(fan_out: Callable[[int], int]) -> None:
    """This process's ``flush(N)`` also closes step N in the processes it drives (as a Monarch
    controller's does): ``fan_out(N)`` asks them (``flush_driven``) and returns how many it asked,
    which the step's marker carries so the sink waits for them."""
    if fan_out not in _fan_outs:
        _fan_outs.append(fan_out)


def follow_driver() -> None:
    """This process's steps are closed by a driving process's flush (``flush_driven``): what it
    records waits for that instead of leaving without a step."""
    runtime = _slot.get()
    if runtime is not None:
        runtime.steps.driven = True


def flush_driven(step: int) -> None:
    """Close ``step`` here, asked by the process that drives this one (``drive_processes``)."""
    runtime = _slot.get()
    if runtime is not None:
        runtime.flush_driven(step)


def flush(step: int) -> None:
    """Close ``step`` on this process: everything recorded since the last flush is exported
    stamped with it. Returns at once; export runs on a background thread."""
    runtime = _slot.get()
    if runtime is not None:
        runtime.close(step, driven=False)


def force_flush(timeout: float = 10.0) -> bool:
    """Block until everything flushed so far has reached the backends and the endpoint."""
    runtime = _slot.current
    if runtime is None:
        return True
    gpu_done = runtime.tracing.force_flush(int(timeout * 1000))
    return runtime.thread.flush(timeout) and gpu_done


def shutdown() -> None:
    """Export what is left (unflushed values go out without a step) and stop the export thread."""
    with _lock:
        _shutdown_locked()


def _shutdown_locked(drain_unflushed: bool = True) -> None:
    runtime = _slot.current
    if runtime is not None and drain_unflushed:
        try:
            _close_last_auto_step(runtime)
        except Exception as exc:
            report_internal_error("last automatic step", exc)
        if _relay is not None:
            # Forked children still running (persistent DataLoader workers) send what they hold first.
            late = _relay.flush_children(min(runtime.shutdown_timeout, _CHILD_SHUTDOWN_TIMEOUT))
            if late:
                warn(f"rankscope: {late} forked child process(es) did not send their values before shutdown")
    _slot.install(None, off=_slot.disabled)
    if runtime is None:
        return
    if runtime.thread.captures is not None:
        runtime.thread.captures.abort()  # a profiler still running stops here, its capture dropped
    runtime.tracing.shutdown()  # GPU-timed spans still pending go to the buffer first
    if drain_unflushed:
        batch = runtime.recorder.take(None)
        if batch is not None:
            runtime.thread.submit(batch)
    runtime.thread.shutdown(runtime.shutdown_timeout)
    if drain_unflushed:
        rates.reset_rates()
    global _dropped_before_shutdown
    _dropped_before_shutdown = runtime.thread.dropped_total
    _wait_for_sink_views(runtime)


def _close_last_auto_step(runtime: Runtime) -> None:
    """In a job whose steps the instrumentors close, what was recorded after the last
    optimizer step (the last loss averaging, a final checkpoint) becomes one more step."""
    runtime.settle_auto_step()
    steps = runtime.steps
    if steps.auto and steps.last is not None and runtime.recorder.accs:
        runtime.close(steps.last + 1, driven=False, auto=True)


def _wait_for_sink_views(runtime: Runtime) -> None:
    """With a sink that this job owns, return once it has written this process's last step,
    so the job's final views are out when the program ends (bounded by the shutdown timeout)."""
    senders = runtime.thread.sender
    control = getattr(senders, "control_url", None)
    last = runtime.steps.last
    if control is None or last is None:
        return
    experiment = str(runtime.resource.attributes[attr.EXPERIMENT_ID])
    deadline = time.monotonic() + runtime.shutdown_timeout
    while time.monotonic() < deadline:
        status = sink_status(control, experiment, run=str(runtime.resource.attributes.get(attr.RUN_ID) or "") or None)
        if status is None or status.get("last_written_step", -1) >= last:
            return
        time.sleep(0.05)


def get_resource() -> Resource | None:
    """This process's Resource (auto-initializing), or None when disabled."""
    runtime = _slot.get()
    return None if runtime is None else runtime.resource


def current_step() -> int | None:
    """The step in progress on this process: ``set_step``'s, else the last flushed step + 1,
    None before any flush."""
    runtime = _slot.current
    return None if runtime is None else runtime.steps.current


def dropped_points() -> int:
    """Points this process could not queue or export so far (after ``shutdown``: in its last run,
    including what shutdown could not drain)."""
    runtime = _slot.current
    return _dropped_before_shutdown if runtime is None else runtime.thread.dropped_total


_dropped_before_shutdown = 0


def capture(reason: str, *, steps: int = 2, ranks: list[int] | None = None) -> None:
    """Ask the experiment's processes (``ranks``; None: every one) to run ``torch.profiler`` for
    their next ``steps`` steps and send the Chrome traces to the sink (``rankscope capture`` from a
    shell does the same). Returns at once: the request goes out on the export thread. Needs a sink
    control URL (the embedded sink, ``rankscope run``, or ``RANKSCOPE_SINK_CONTROL``)."""
    if not isinstance(reason, str):
        raise TypeError(f"capture: reason must be a str, got {reason!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 64:
        raise ValueError(f"capture: steps must be an int in [1, 64], got {steps!r}")
    if ranks is not None and not all(type(r) is int and r >= 0 for r in ranks):
        raise ValueError(f"capture: ranks must be non-negative ints, got {ranks!r}")
    runtime = _slot.get()
    if runtime is not None and runtime.thread.captures is not None:
        runtime.thread.captures.ask(reason, steps, None if ranks is None else list(ranks))


def write_report(timeout: float = 75.0) -> str | None:
    """Have this experiment's sink write its report page now and return the page's path.

    First waits until what this process flushed has reached the sink; the page then holds every
    step the sink finalized. Needs a sink control URL (the embedded sink, ``rankscope run``, or
    ``RANKSCOPE_SINK_CONTROL``) and the ``report`` view among the experiment's views (or a sink
    run with ``--report``). Otherwise, or when the sink cannot be reached, warns and returns None:
    a report never stops the job."""
    runtime = _slot.get()
    if runtime is None:
        return None
    force_flush(min(timeout, runtime.shutdown_timeout))
    control = getattr(runtime.thread.sender, "control_url", None)
    if control is None:
        warn(
            "rankscope: write_report needs this experiment's sink (the embedded sink of a multi-process job, "
            "rankscope run, or RANKSCOPE_SINK_CONTROL); a lone process writes its report view at shutdown"
        )
        return None
    experiment = str(runtime.resource.attributes[attr.EXPERIMENT_ID])
    try:
        paths = request_report(
            control, experiment, timeout, str(runtime.resource.attributes.get(attr.RUN_ID) or "") or None
        )
    except (OSError, RuntimeError) as exc:
        warn(f"rankscope: no report: {exc}")
        return None
    return paths[0] if paths else None


# -- processes made by fork ---------------------------------------------------------------
#
# A forked child (a torch DataLoader worker, a multiprocessing worker) is a new process with a
# copy of this one's memory: the export thread did not survive the fork, and any lock another
# thread held at that moment stays held forever in the child. So the child never touches the
# parent's runtime (it keeps a reference to it, so that no destructor runs in the child either).
# ``_after_fork_in_child`` forgets it and makes a fresh module lock; the child's first rankscope
# call re-arms it (``_rearm_forked_child``): a new export thread and the parent's identity with a
# new ``service.instance.id``, ``process.pid`` and ``process.parent_pid``. The child never
# flushes, so a sink counts it as one more process of the experiment whose points join the step
# in progress, never as a rank it waits for.
#
# The child does not use gRPC: with the gRPC core it inherited, a child crashed now and then
# (SIGSEGV, 2 of 160 forks under load; see ``senders``). Each fork gets a Unix socket pair
# (``_before_fork``); the child's export thread sends its OTLP requests over it, and the parent's
# ``ForkRelay`` thread hands them to the parent's export thread, which exports them with its own
# queue and retries. The child exports every ``export_interval`` and at exit: multiprocessing
# children end in ``os._exit`` (atexit does not run), so a multiprocessing finalizer shuts
# rankscope down first. Children still running when the parent shuts down (persistent DataLoader
# workers) are asked over the same pair to send what they hold, and the parent waits for them
# (at most ``_CHILD_SHUTDOWN_TIMEOUT``). A parent that keeps its views to itself (no endpoint, no
# sink) has nowhere a child's values could go: the child refuses them with one warning per
# parent (a shared page remembers that it was said).

_CHILD_SHUTDOWN_TIMEOUT = 2.0


class _ForkOrigin:
    """What a forked child needs from its parent's runtime (plain values, read right after fork)."""

    def __init__(self, parent: Runtime, sock: Any, warned: mmap.mmap | None) -> None:
        self.attributes = dict(parent.resource.attributes)
        self.parent_pid = os.getppid()  # runs in the child, right after fork
        otlp = parent.thread.sender
        self.senders: RelaySender | None = None
        self.listen = False  # whether the parent may ask this child to flush (its own socket)
        self.why_not = "it keeps its views in its own process (no endpoint, no sink)"
        if isinstance(otlp, RelaySender):  # a grandchild: the same way up to the process that exports
            self.senders = otlp.for_child()
        elif otlp is not None and sock is not None:
            self.senders, self.listen = RelaySender(sock, self.parent_pid), True
        elif otlp is not None:
            self.why_not = "no relay socket could be made for this child"
        self.settings = replace(  # the parent's, read once at its init; a child's shutdown is shorter
            parent.settings, shutdown_timeout=min(parent.settings.shutdown_timeout, _CHILD_SHUTDOWN_TIMEOUT)
        )
        self.last_step = parent.steps.last
        self.warned = warned


_fork_origin: _ForkOrigin | None = None
_refusal_page: mmap.mmap | None = None
_multiprocessing_finalizer: Any = None
_relay: ForkRelay | None = None
_fork_pair: Any = None
_forked_from: Any = None
"""In a child: the parent's runtime, kept referenced and never used (no gRPC destructor runs here)."""


_late_relayed = False


def _deliver_relayed(kind: bytes, payload: bytes) -> None:
    global _late_relayed
    runtime = _slot.current
    if runtime is not None:
        runtime.thread.relay(kind, payload)
    elif not _late_relayed:  # a child exported after our shutdown: nowhere to send it, but say so
        _late_relayed = True
        warn("rankscope: a forked child exported values after this process shut rankscope down; not sent")


def _before_fork() -> None:
    """In the parent, on the forking thread: a socket pair for the child (or the refusal page)."""
    global _refusal_page, _relay, _fork_pair
    runtime = _slot.current
    if runtime is None or _slot.disabled:
        return
    try:
        otlp = runtime.thread.sender
        if otlp is None:
            if _refusal_page is None:
                _refusal_page = mmap.mmap(-1, 1)
        elif not isinstance(otlp, RelaySender):
            if _relay is None:
                _relay = ForkRelay(_deliver_relayed)
            _fork_pair = fork_pair()
    except Exception as exc:  # the child then refuses its values with a warning
        _fork_pair = None
        report_internal_error("fork relay", exc)


def _after_fork_in_parent() -> None:
    global _fork_pair
    pair, _fork_pair = _fork_pair, None
    if pair is not None and _relay is not None:
        _relay.adopt(pair[0])
        pair[1].close()


def _after_fork_in_child() -> None:
    """A forked child is a new process: forget the parent's runtime; the first call re-arms."""
    global _lock, _fork_origin, _dropped_before_shutdown
    global _multiprocessing_finalizer, _relay, _fork_pair, _forked_from
    parent, pair, relay, inherited = _slot.current, _fork_pair, _relay, _fork_origin
    _lock = threading.RLock()  # another thread may have held the parent's at fork time
    _slot.install(None, off=_slot.disabled)
    _dropped_before_shutdown = 0
    _multiprocessing_finalizer = _fork_pair = _relay = _fork_origin = None
    _fan_outs.clear()  # the processes the parent drives are the parent's
    if parent is not None:
        _forked_from = parent
    try:
        if relay is not None:
            relay.close_in_child()  # the siblings' sockets are the parent's to read
        if pair is not None:
            pair[0].close()
        if parent is not None and not _slot.disabled:
            _fork_origin = _ForkOrigin(parent, None if pair is None else pair[1], _refusal_page)
        elif inherited is not None:  # forked again before its first call: same way up
            inherited.parent_pid = os.getppid()
            _fork_origin = inherited
    except Exception as exc:  # the child then initializes from its environment
        report_internal_error("fork", exc)


def _rearm_forked_child(origin: _ForkOrigin) -> None:
    """The child's first call: join the parent's experiment as a process of its own (under ``_lock``)."""
    global _fork_origin
    _fork_origin = None
    if origin.senders is None:
        _slot.install(None, off=True)
        page = origin.warned
        if page is None or page[0] == 0:
            if page is not None:
                page[0] = 1
            warn(
                f"rankscope: values recorded in forked child processes (pid {os.getpid()}: DataLoader "
                f"workers, multiprocessing) are not recorded: their parent (pid {origin.parent_pid}) "
                f"{origin.why_not}. To collect them, give the job a sink: RANKSCOPE_SINK=embedded, "
                "RANKSCOPE_ENDPOINT, or `rankscope run`"
            )
        return
    attributes: dict[str, Any] = dict(origin.attributes)
    attributes[attr.SERVICE_INSTANCE_ID] = uuid.uuid4().hex
    attributes[attr.PROCESS_PID] = os.getpid()
    attributes[attr.PROCESS_PARENT_PID] = origin.parent_pid
    resource = Resource(attributes)
    runtime = _start_runtime(
        resource,
        origin.settings,
        origin.senders,
        BackendSet([], {}, process_label(resource.attributes)),
        stream_to_sink=False,
        trace_root=False,
    )
    runtime.steps.auto = False  # never stepped: the sink must not wait for a worker
    runtime.steps.last = origin.last_step  # its spans hang under the parent's step in progress
    if origin.listen:
        senders = origin.senders
        senders.listen(lambda: runtime.thread.poll(senders.ack))
    _slot.install(runtime)
    bind_compile_check()
    _finalize_in_multiprocessing_child()


def _finalize_in_multiprocessing_child() -> None:
    """multiprocessing children leave through ``os._exit`` after running their finalizers, not atexit."""
    global _multiprocessing_finalizer
    if _multiprocessing_finalizer is not None:
        return
    try:
        import multiprocessing
        from multiprocessing import util

        if multiprocessing.parent_process() is None:
            return
        _multiprocessing_finalizer = util.Finalize(None, shutdown, exitpriority=100)
    except Exception as exc:
        report_internal_error("multiprocessing exit hook", exc)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
atexit.register(shutdown)


def auto_step() -> None:
    """An instrumentor saw a training step end (see ``Runtime.auto_step``)."""
    runtime = _slot.get()
    if runtime is not None:
        runtime.auto_step()


def settle_auto_step() -> None:
    """Close the step ``auto_step`` left pending (instrumentors call this before recording)."""
    runtime = _slot.current
    if runtime is not None and runtime.steps.auto_pending:
        runtime.settle_auto_step()
