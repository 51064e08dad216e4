"""The public calls: init, record_metric, flush, force_flush, shutdown (tracing: ``tracing``).

Process state lives in module globals so ``record_metric`` costs one global read and a
dict lookup on its fast path (a Python float for a key already seen this step). The
first call of any function auto-initializes from the environment.
"""

from __future__ import annotations

import atexit
import json
import mmap
import os
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource

from .backends.base import LoggerBackend, LoggingMode, get_backend_class
from .core import names as attr
from .core.identity import build_resource, process_label
from .core.settings import resolve
from .export.senders import (
    EmbeddedSenders,
    ForkRelay,
    RelaySenders,
    Senders,
    fork_pair,
    has_endpoint,
    post_config,
    sink_status,
)
from .export.thread import BackendSet, ExportThread
from .export.thread import _warn as _warn_export
from .metrics.recorder import Collector, StepBatch
from .metrics.reduce import Reduce
from .tracing.provider import install_tracer_provider
from .tracing.tracer import TracingState

_MEAN = Reduce.MEAN

# Hot-path state. ``_collector`` is None until init (or when disabled).
_collector: Collector | None = None
_disabled = False
_runtime: _Runtime | None = None
_lock = threading.RLock()
internal_errors: list[str] = []
"""Internal errors seen in this process (most recent last, bounded); tests assert it stays empty."""


class _Runtime:
    """One initialized rankscope in one process."""

    def __init__(
        self,
        resource: Resource,
        collector: Collector,
        thread: ExportThread,
        shutdown_timeout: float,
        tracing: TracingState,
    ):
        self.resource = resource
        self.tracing = tracing
        self.collector = collector
        self.thread = thread
        self.shutdown_timeout = shutdown_timeout
        self.flushed = False
        self.last_step: int | None = None
        self.monarch_controller = False
        self.auto_steps = True
        """Instrumentors may close steps (``auto_step``) until the program flushes by itself."""
        self.driven_steps = False
        """A Monarch actor process: its controller closes its steps."""
        self.closed_steps: _RecentSteps = _RecentSteps()

    @property
    def monarch_steps(self) -> bool:
        """A Monarch controller or actor: steps come from the controller's ``flush``, so values
        wait for it instead of going out early without a step (periodic exports)."""
        return self.monarch_controller or self.driven_steps

    @property
    def current_step(self) -> int | None:
        """The step in progress: the one after the last flushed step (None before any flush)."""
        return None if self.last_step is None else self.last_step + 1


class _RecentSteps(set[int]):
    """The steps closed lately (bounded: only a late controller flush asks)."""

    def add(self, step: int) -> None:
        super().add(step)
        if len(self) > 1024:
            for old in sorted(self)[:512]:
                self.discard(old)


def _report_internal_error(where: str, exc: BaseException) -> None:
    """Telemetry never takes the job down: internal errors become a warning."""
    message = f"rankscope: internal error in {where}: {exc!r}"
    internal_errors.append(message)
    del internal_errors[:-100]
    if "PYTEST_CURRENT_TEST" in os.environ:  # loud in our own tests
        traceback.print_exception(exc)
    warnings.warn(message, RuntimeWarning, stacklevel=2)


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
        export_interval: seconds between periodic exports before the first flush.
        disable: make every call a no-op (``RANKSCOPE_DISABLE``).

    Returns:
        The process Resource, or None when disabled. Calling init again reconfigures:
        values recorded so far are kept for the next flush. A program that calls init
        closes its own steps with ``flush``: instrumentors stop closing them (``auto_step``).
    """
    global _collector, _disabled, _runtime, _fork_origin
    with _lock:
        if resolve("disable", disable):
            _shutdown_locked()
            _collector, _disabled = None, True
            return None
        previous = _runtime
        resource = build_resource(experiment=experiment, role=role, replica=replica, mesh=mesh)
        label = process_label(resource)
        experiment_id = str(resource.attributes[attr.EXPERIMENT_ID])
        views: dict[str, Any] = {k: dict(v) for k, v in (backends or resolve("backends") or {}).items()}
        stream = any(v.get("logging_mode") == LoggingMode.PER_RANK_NO_REDUCE.value for v in views.values())
        senders, views_in_sink = _make_senders(
            resource, resolve("endpoint", endpoint), resolve("protocol", protocol), views, stream
        )
        world = resource.attributes.get(attr.WORLD_SIZE)
        backend_objects = [] if views_in_sink else _make_backends(views, alone=world == "1" and senders is None)
        init_kwargs = {
            "rank": resource.attributes.get(attr.RANK),
            "world_size": world,
            "role": resource.attributes.get(attr.ROLE),
            "replica": resource.attributes.get(attr.REPLICA),
            "experiment": experiment_id,
        }
        backend_set = BackendSet(backend_objects, init_kwargs, label)
        monarch_controller = _is_monarch_controller()
        runtime = _start_runtime(
            resource,
            senders,
            backend_set,
            stream_to_sink=views_in_sink and stream,
            trace_root=_is_trace_root(resource, monarch_controller),
            export_interval=resolve("export_interval", export_interval),
            shutdown_timeout=resolve("shutdown_timeout"),
        )
        collector, tracing = runtime.collector, runtime.tracing
        runtime.monarch_controller = monarch_controller
        # Monarch actors follow their controller's steps.
        runtime.driven_steps = "monarch" in sys.modules and not monarch_controller
        runtime.auto_steps = False  # an explicit init: the program closes its own steps (_auto_init differs)
        if previous is not None:  # keep what was recorded before re-init
            collector.accs = previous.collector.accs
            tracing.last_step, tracing.explicit_step = previous.tracing.last_step, previous.tracing.explicit_step
            _shutdown_locked(drain_unflushed=False)
        # Children of this process (spawned workers, `rankscope run` commands) join this experiment.
        os.environ["RANKSCOPE_EXPERIMENT"] = experiment_id
        if endpoint is not None:
            os.environ["RANKSCOPE_ENDPOINT"] = endpoint
        if backends is not None:
            os.environ["RANKSCOPE_BACKENDS"] = json.dumps(views)
        _runtime, _collector, _disabled, _fork_origin = runtime, collector, False, None
        _bind_compile_check()
        install_tracer_provider(resource)
        _finalize_in_multiprocessing_child()
        if "monarch" in sys.modules:
            _install_monarch_propagation()
        return resource


def _start_runtime(
    resource: Resource,
    senders: Senders | EmbeddedSenders | RelaySenders | None,
    backend_set: BackendSet,
    *,
    stream_to_sink: bool,
    trace_root: bool,
    export_interval: float,
    shutdown_timeout: float,
) -> _Runtime:
    """A collector, tracing state and export thread for ``resource`` (init, or a forked child's re-arm)."""
    collector = Collector(streams=[])
    tracing = TracingState(
        resource,
        sample_ratio=resolve("trace_sample") if senders is not None else 0.0,  # spans need somewhere to go
        root=trace_root,
        max_spans=resolve("max_queued_spans"),
        on_error=_report_internal_error,
    )
    runtime: _Runtime | None = None
    thread = ExportThread(
        resource=resource,
        collector=collector,
        backends=backend_set,
        otlp=senders,
        stream_to_sink=stream_to_sink,
        export_interval=export_interval,
        max_queued_steps=resolve("max_queued_steps"),
        periodic=lambda: runtime is not None and not runtime.flushed and not runtime.monarch_steps,
        on_error=_report_internal_error,
        spans=tracing.buffer,
    )
    runtime = _Runtime(resource, collector, thread, shutdown_timeout, tracing)
    if backend_set.streaming or thread.stream_to_sink:
        collector.set_streams([lambda k, v, r, t: thread.stream(k, v, r, t, runtime.current_step)])
    return runtime


def _is_trace_root(resource: Resource, monarch_controller: bool) -> bool:
    """Whether this process emits each step's root span (exactly one process per experiment)."""
    explicit = resolve("trace_root")
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
        from .integrations.monarch.propagation import install_caller

        install_caller()
    except Exception as exc:
        _report_internal_error("Monarch context propagation", exc)


def _make_senders(
    resource: Resource, endpoint: str | None, protocol: str, views: dict[str, Any], stream: bool
) -> tuple[Senders | EmbeddedSenders | None, bool]:
    """Where this process's OTLP goes, and whether its views run in that sink.

    An endpoint: export there; views run in the sink only when it takes posted configs
    (``rankscope run`` sets ``RANKSCOPE_SINK_CONTROL``). No endpoint: a multi-process job
    (or ``RANKSCOPE_SINK=embedded``) uses the experiment's embedded sink; a lone process
    keeps its views to itself.
    """
    experiment = str(resource.attributes[attr.EXPERIMENT_ID])
    control = resolve("sink_control")
    if has_endpoint(endpoint):
        if control is None:
            return Senders(endpoint, protocol, stream=False), False

        def post_then_send() -> tuple[str, str]:
            _post_views(control, experiment, views)
            return endpoint or "", control

        return EmbeddedSenders(post_then_send, protocol, stream), True
    mode = resolve("sink")
    multi = resource.attributes.get(attr.WORLD_SIZE) != "1" or "monarch" in sys.modules
    if mode == "embedded" or (mode == "auto" and multi):

        def connect() -> tuple[str, str]:
            from .sink.embedded import connect as connect_embedded

            found = connect_embedded(experiment)
            _post_views(found[1], experiment, views)
            return found

        return EmbeddedSenders(connect, "grpc", stream), True
    return None, False


def _post_views(control: str, experiment: str, views: dict[str, Any]) -> None:
    if views:
        try:
            answer = post_config(control, experiment, views)
        except OSError as exc:
            answer = f"could not post: {exc}"
        if answer != "ok":
            _warn_export(f"rankscope: the sink did not take this process's views ({answer})")


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


def _auto_init() -> Collector | None:
    with _lock:
        if _collector is None and not _disabled and _fork_origin is not None:
            try:
                _rearm_forked_child(_fork_origin)
            except Exception as exc:
                _report_internal_error("re-arm after fork", exc)
            return _collector
        if _collector is None and not _disabled:
            try:
                init()
                if _runtime is not None:  # first use, no init(): instrumentors may close steps
                    _runtime.auto_steps = resolve("auto_step") and not _runtime.driven_steps
            except ValueError:
                raise  # a bad RANKSCOPE_*/OTEL_* value: the user must see it
            except Exception as exc:
                _report_internal_error("auto-init", exc)
        return _collector


def record_metric(key: str, value: Any, reduce: Reduce = _MEAN) -> None:
    """Record ``value`` under ``key``; reduced per step by ``reduce`` (default MEAN).

    Callable from any function of any process. Raises ``TypeError``/``ValueError`` naming
    the key for a non-numeric or multi-element value, an empty or invalid key, or a key
    already recorded with another reduce type. CUDA tensors are not synchronized here.
    """
    c = _collector
    if c is None:
        if _disabled:
            return
        c = _auto_init()
        if c is None:
            return
    if c.fast and (type(value) is float or type(value) is int):
        acc = c.accs.get(key)
        if acc is not None and acc.reduction_type is reduce:
            acc.append(value)
            return
    if _is_compiling():  # torch.compile tracing: telemetry stays out of the graph
        return
    c.record(key, value, reduce)


def _never() -> bool:
    return False


_is_compiling = _never


def _bind_compile_check() -> None:
    global _is_compiling
    torch = sys.modules.get("torch")
    if torch is not None and _is_compiling is _never:
        _is_compiling = torch.compiler.is_compiling


def flush(step: int) -> None:
    """Close ``step`` on this process: everything recorded since the last flush is exported
    stamped with it. Returns at once; export runs on a background thread."""
    _flush(step, driven=False)


def flush_driven(step: int) -> None:
    """``flush`` sent by a Monarch controller to its actor processes.

    It may arrive after an endpoint call of a later step already closed ``step`` here
    (``catch_up``): then it is a no-op, or only the step's marker when catching up skipped it.
    """
    runtime = _runtime
    if runtime is not None and runtime.last_step is not None and step <= runtime.last_step:
        if step not in runtime.closed_steps:
            runtime.closed_steps.add(step)
            now = time.time_ns()
            runtime.thread.submit(StepBatch(step, now, now, {}, None, driven=True))
        return
    _flush(step, driven=True)


def catch_up(step: int) -> None:
    """An endpoint call of the controller's step ``step`` arrived in this actor process: close
    the step before it first if the controller's ``flush`` has not arrived yet (Monarch orders
    it only after the replies the controller awaited, not before its next calls), so what the
    call records lands in ``step`` exactly."""
    runtime = _runtime
    if runtime is None:
        if _disabled or step == 0 or _auto_init() is None:
            return
        runtime = _runtime
        assert runtime is not None
    if runtime.driven_steps and step > 0 and (runtime.last_step is None or runtime.last_step < step - 1):
        _flush(step - 1, driven=True)


_auto_step_pending = False


def auto_step() -> None:
    """An instrumentor saw a training step end (an optimizer step): it will be closed as the
    next step, unless the program closes steps itself (it calls ``flush``) or a Monarch
    controller does.

    The close waits for the next instrumented event (``settle_auto_step``) or shutdown: a
    program that calls ``flush`` right after ``optimizer.step()`` gets there first, and its
    own step numbers win without a duplicate step.
    """
    global _auto_step_pending
    runtime = _runtime
    if runtime is None:
        if _disabled or _auto_init() is None:
            return
        runtime = _runtime
        assert runtime is not None
    if runtime.auto_steps:
        _auto_step_pending = True


def settle_auto_step() -> None:
    """Close the step ``auto_step`` left pending (instrumentors call this before recording)."""
    global _auto_step_pending
    if not _auto_step_pending:
        return
    _auto_step_pending = False
    runtime = _runtime
    if runtime is not None and runtime.auto_steps:
        _flush(0 if runtime.last_step is None else runtime.last_step + 1, driven=False, auto=True)


_flush_hooks: list[Callable[[], None]] = []


def add_flush_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` at every flush, before the step is closed (instrumentors sample gauges there)."""
    if hook not in _flush_hooks:
        _flush_hooks.append(hook)


def remove_flush_hook(hook: Callable[[], None]) -> None:
    if hook in _flush_hooks:
        _flush_hooks.remove(hook)


def _flush(step: int, driven: bool, auto: bool = False) -> None:
    if _disabled:
        return
    runtime = _runtime
    if runtime is None:
        if _auto_init() is None:
            return
        runtime = _runtime
        assert runtime is not None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"flush(step): step must be a non-negative int, got {step!r}")
    if not auto:
        global _auto_step_pending
        runtime.auto_steps = _auto_step_pending = False
    _bind_compile_check()
    for hook in tuple(_flush_hooks):
        try:
            hook()
        except Exception as exc:
            _report_internal_error(f"flush hook {getattr(hook, '__qualname__', hook)}", exc)
    batch = runtime.collector.take(step)
    runtime.flushed = True
    runtime.last_step = step
    runtime.closed_steps.add(step)
    if runtime.monarch_controller:
        try:
            from .integrations.monarch.actors import flush_actors

            asked = flush_actors(step)
        except Exception as exc:
            _report_internal_error("Monarch actor flush", exc)
            asked = 0
        if batch is not None and asked:
            batch.expected = asked + 1
    try:
        runtime.tracing.closed(step)
    except Exception as exc:
        _report_internal_error("step root span", exc)
    if batch is not None:
        batch.driven = driven
        runtime.thread.submit(batch)


def force_flush(timeout: float = 10.0) -> bool:
    """Block until everything flushed so far has reached the backends and the endpoint."""
    runtime = _runtime
    if runtime is None:
        return True
    gpu_done = runtime.tracing.force_flush(int(timeout * 1000))
    return runtime.thread.flush(timeout) and gpu_done


def shutdown() -> None:
    """Export what is left (unflushed values go out without a step) and stop the export thread."""
    with _lock:
        _shutdown_locked()


def _shutdown_locked(drain_unflushed: bool = True) -> None:
    global _collector, _runtime
    if drain_unflushed:
        try:
            _close_last_auto_step()
        except Exception as exc:
            _report_internal_error("last automatic step", exc)
    runtime = _runtime
    if runtime is not None and drain_unflushed and _relay is not None:
        # Forked children still running (persistent DataLoader workers) send what they hold first.
        late = _relay.flush_children(min(runtime.shutdown_timeout, _CHILD_SHUTDOWN_TIMEOUT))
        if late:
            _warn_export(f"rankscope: {late} forked child process(es) did not send their values before shutdown")
    _runtime, _collector = None, None
    if runtime is None:
        return
    runtime.tracing.shutdown()  # GPU-timed spans still pending go to the buffer first
    if drain_unflushed:
        batch = runtime.collector.take(None)
        if batch is not None:
            runtime.thread.submit(batch)
    runtime.thread.shutdown(runtime.shutdown_timeout)
    if drain_unflushed:
        from .metrics.rates import reset_rates

        reset_rates()
    global _dropped_before_shutdown
    _dropped_before_shutdown = runtime.thread.dropped_total
    _wait_for_sink_views(runtime)


def _close_last_auto_step() -> None:
    """In a job whose steps the instrumentors close, what was recorded after the last
    optimizer step (the last loss averaging, a final checkpoint) becomes one more step."""
    settle_auto_step()
    runtime = _runtime
    if runtime is not None and runtime.auto_steps and runtime.last_step is not None and runtime.collector.accs:
        _flush(runtime.last_step + 1, driven=False, auto=True)


def _wait_for_sink_views(runtime: _Runtime) -> None:
    """With a sink that this job owns, return once it has written this process's last step,
    so the job's final views are out when the program ends (bounded by the shutdown timeout)."""
    senders = runtime.thread.otlp
    control = getattr(senders, "control_url", None)
    if control is None or runtime.last_step is None:
        return
    experiment = str(runtime.resource.attributes[attr.EXPERIMENT_ID])
    deadline = time.monotonic() + runtime.shutdown_timeout
    while time.monotonic() < deadline:
        status = sink_status(control, experiment)
        if status is None or status.get("last_written_step", -1) >= runtime.last_step:
            return
        time.sleep(0.05)


def get_resource() -> Resource | None:
    """This process's Resource (auto-initializing), or None when disabled."""
    if _runtime is None and _auto_init() is None:
        return None
    return _runtime.resource if _runtime is not None else None


def defer_gpu_duration(avg_key: str, max_key: str, start: Any, end: Any, processor: Any) -> None:
    """A ``timer="gpu"`` phase: its duration is read from CUDA events on the export thread."""
    c = _collector
    if c is not None:
        c.defer(avg_key, max_key, start, end, processor)


def current_step() -> int | None:
    """The step in progress on this process: last flushed step + 1, None before any flush."""
    return None if _runtime is None else _runtime.current_step


def dropped_points() -> int:
    """Points this process could not queue or export so far (after ``shutdown``: in its last run,
    including what shutdown could not drain)."""
    return _dropped_before_shutdown if _runtime is None else _runtime.thread.dropped_total


_dropped_before_shutdown = 0


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
_PARENT_PID = "process.parent_pid"  # OTel semantic conventions


class _ForkOrigin:
    """What a forked child needs from its parent's runtime (plain values, read right after fork)."""

    def __init__(self, parent: _Runtime, sock: Any, warned: mmap.mmap | None) -> None:
        self.attributes = dict(parent.resource.attributes)
        self.parent_pid = os.getppid()  # runs in the child, right after fork
        otlp = parent.thread.otlp
        self.senders: RelaySenders | None = None
        self.listen = False  # whether the parent may ask this child to flush (its own socket)
        self.why_not = "it keeps its views in its own process (no endpoint, no sink)"
        if isinstance(otlp, RelaySenders):  # a grandchild: the same way up to the process that exports
            self.senders = otlp.for_child()
        elif otlp is not None and sock is not None:
            self.senders, self.listen = RelaySenders(sock, self.parent_pid), True
        elif otlp is not None:
            self.why_not = "no relay socket could be made for this child"
        self.export_interval = parent.thread.export_interval
        self.shutdown_timeout = min(parent.shutdown_timeout, _CHILD_SHUTDOWN_TIMEOUT)
        self.last_step = parent.tracing.last_step
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
    runtime = _runtime
    if runtime is not None:
        runtime.thread.relay(kind, payload)
    elif not _late_relayed:  # a child exported after our shutdown: nowhere to send it, but say so
        _late_relayed = True
        _warn_export("rankscope: a forked child exported values after this process shut rankscope down; not sent")


def _before_fork() -> None:
    """In the parent, on the forking thread: a socket pair for the child (or the refusal page)."""
    global _refusal_page, _relay, _fork_pair
    runtime = _runtime
    if runtime is None or _disabled:
        return
    try:
        otlp = runtime.thread.otlp
        if otlp is None:
            if _refusal_page is None:
                _refusal_page = mmap.mmap(-1, 1)
        elif not isinstance(otlp, RelaySenders):
            if _relay is None:
                _relay = ForkRelay(_deliver_relayed)
            _fork_pair = fork_pair()
    except Exception as exc:  # the child then refuses its values with a warning
        _fork_pair = None
        _report_internal_error("fork relay", exc)


def _after_fork_in_parent() -> None:
    global _fork_pair
    pair, _fork_pair = _fork_pair, None
    if pair is not None and _relay is not None:
        _relay.adopt(pair[0])
        pair[1].close()


def _after_fork_in_child() -> None:
    """A forked child is a new process: forget the parent's runtime; the first call re-arms."""
    global _collector, _runtime, _auto_step_pending, _lock, _fork_origin, _dropped_before_shutdown
    global _multiprocessing_finalizer, _relay, _fork_pair, _forked_from
    parent, pair, relay, inherited = _runtime, _fork_pair, _relay, _fork_origin
    _lock = threading.RLock()  # another thread may have held the parent's at fork time
    _collector, _runtime, _auto_step_pending, _dropped_before_shutdown = None, None, False, 0
    _multiprocessing_finalizer = _fork_pair = _relay = _fork_origin = None
    if parent is not None:
        _forked_from = parent
    try:
        if relay is not None:
            relay.close_in_child()  # the siblings' sockets are the parent's to read
        if pair is not None:
            pair[0].close()
        if parent is not None and not _disabled:
            _fork_origin = _ForkOrigin(parent, None if pair is None else pair[1], _refusal_page)
        elif inherited is not None:  # forked again before its first call: same way up
            inherited.parent_pid = os.getppid()
            _fork_origin = inherited
    except Exception as exc:  # the child then initializes from its environment
        _report_internal_error("fork", exc)


def _rearm_forked_child(origin: _ForkOrigin) -> None:
    """The child's first call: join the parent's experiment as a process of its own (under ``_lock``)."""
    global _collector, _disabled, _runtime, _fork_origin
    _fork_origin = None
    if origin.senders is None:
        _collector, _disabled = None, True
        page = origin.warned
        if page is None or page[0] == 0:
            if page is not None:
                page[0] = 1
            _warn_export(
                f"rankscope: values recorded in forked child processes (pid {os.getpid()}: DataLoader "
                f"workers, multiprocessing) are not recorded: their parent (pid {origin.parent_pid}) "
                f"{origin.why_not}. To collect them, give the job a sink: RANKSCOPE_SINK=embedded, "
                "RANKSCOPE_ENDPOINT, or `rankscope run`"
            )
        return
    attributes: dict[str, Any] = dict(origin.attributes)
    attributes[attr.SERVICE_INSTANCE_ID] = uuid.uuid4().hex
    attributes[attr.PROCESS_PID] = os.getpid()
    attributes[_PARENT_PID] = origin.parent_pid
    resource = Resource(attributes)
    runtime = _start_runtime(
        resource,
        origin.senders,
        BackendSet([], {}, process_label(resource)),
        stream_to_sink=False,
        trace_root=False,
        export_interval=origin.export_interval,
        shutdown_timeout=origin.shutdown_timeout,
    )
    runtime.auto_steps = False  # never stepped: the sink must not wait for a worker
    runtime.tracing.last_step = origin.last_step
    if origin.listen:
        senders = origin.senders
        senders.listen(lambda: runtime.thread.poll(senders.ack))
    _runtime, _collector, _disabled = runtime, runtime.collector, False
    _bind_compile_check()
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
        _report_internal_error("multiprocessing exit hook", exc)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
atexit.register(shutdown)
