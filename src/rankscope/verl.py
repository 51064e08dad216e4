"""verl: ``trainer.logger=['console','rankscope']``, and verl's workers as processes of their roles.

One setting on verl's command line does both, in every process of the Ray job::

    RANKSCOPE_EXPERIMENT=gsm8k-grpo python -m verl.trainer.main_ppo ... 'trainer.logger=[console,rankscope]' \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rankscope.verl.register

Ray calls ``register`` as each of the job's processes starts (verl passes its ``ray_init``
settings on), before verl's classes are loaded there. It

- adds ``rankscope`` to ``Tracking``'s fixed list of backends (verl builds ``Tracking`` inside the
  Ray actor that runs the trainer): every number the trainer logs at a global step (its workers'
  metrics, gathered under their role's prefix: ``actor/pg_loss``, ``critic/score/mean``,
  ``timing_s/gen``, validation's ``val-core/...``) is recorded at that step, which is closed as it
  is logged (verl logs a step once, at its end);
- times every method verl's workers register for the trainer to call (``update_actor``,
  ``compute_log_prob``, ``compute_ref_log_prob``, ...; verl's ``@register``): in each worker
  process, a span and ``<method>/total_duration_avg_s``/``_max_s``, under the worker's role
  (``actor_rollout_ref``, ``actor``, ``ref``, ``critic``...) and rank. Workers do not know the
  global step; the sink places their data in the step whose time window holds it;
- gives the Ray job one rankscope run (``RANKSCOPE_RUN_ID`` from Ray's session and job ids) and,
  unless ``RANKSCOPE_EXPERIMENT`` says otherwise, the experiment ``verl``: the trainer and the
  workers are siblings, not children, so they would not inherit one otherwise.

A driver of your own calls ``rankscope.verl.register()`` before it builds ``Tracking``. Keys OTel
does not take are renamed by one rule (``mean@4`` → ``mean_at4``). Needs ``verl`` (read from
0.9.1) and Ray; rankscope imports them only here, and ``register`` does nothing where verl is not.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from numbers import Real
from typing import Any

from .api import flush, force_flush, init, record_metric, set_step, trace
from .core import runtime as _slot
from .core.errors import report_internal_error, warn_once
from .lifecycle import drive_processes, flush_driven, follow_driver
from .metrics.reduce import Reduce
from .metrics.values import as_metric_name

BACKEND = "rankscope"


class RankscopeVerlLogger:
    """One of verl's tracking backends (``log(data, step)``, ``finish()``), on the trainer's process."""

    def __init__(self, reduces: Mapping[str, Reduce] | None = None) -> None:
        if _slot.current is None:  # not set up yet in this process: it is the trainer
            init(role=os.environ.get("RANKSCOPE_ROLE") or "trainer")
        self._reduces = dict(reduces or {})
        self._closed: int | None = None

    def log(self, data: Mapping[str, Any], step: int) -> None:
        try:
            step = int(step)
            if self._closed is not None and step <= self._closed:
                warn_once(f"rankscope.verl: verl logged step {step} after step {self._closed} closed; not recorded")
                return
            set_step(step)
            for key, value in data.items():
                self._record(key, value)
            flush(step)  # verl logs a step once, at its end
            self._closed = step
        except Exception as exc:  # telemetry never breaks the training loop
            report_internal_error("verl tracking", exc)

    def finish(self, timeout: float = 10.0) -> None:
        """The end of training: the workers and this process deliver what they hold."""
        try:
            workers.drain(timeout)
            force_flush(timeout)
        except Exception as exc:
            report_internal_error("verl tracking finish", exc)

    def _record(self, key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, Real):
            return  # verl also logs strings and tables to some backends: numbers only here
        name = as_metric_name(str(key))
        if name is None:
            warn_once(f"rankscope.verl: {key!r} has no valid metric name; not recorded")
            return
        record_metric(name, float(value), self._reduces.get(str(key), Reduce.MEAN))


def register(reduces: Mapping[str, Reduce] | None = None) -> None:
    """Set up rankscope for verl in this process (see the module docstring); idempotent.

    A Ray setup hook runs in every process of the job, verl's or not: without verl, nothing."""
    try:
        from verl.single_controller.base import decorator
        from verl.utils.tracking import Tracking
    except ImportError:
        return
    from verl.single_controller.base import Worker
    from verl.single_controller.ray import RayWorkerGroup

    _pin_ray_job(os.environ)
    _add_backend(Tracking, reduces)
    _time_worker_methods(decorator)
    workers.install(Worker, RayWorkerGroup)


def _pin_ray_job(env: MutableMapping[str, str]) -> None:
    """One experiment and run for every process of this Ray job (they are siblings: nothing inherits)."""
    import ray

    if not ray.is_initialized():
        return
    context = ray.get_runtime_context()
    env.setdefault("RANKSCOPE_EXPERIMENT", "verl")
    launch = f"{context.get_session_name()}-{context.get_job_id()}".removeprefix("session_")
    env.setdefault("RANKSCOPE_RUN_ID", re.sub(r"[^A-Za-z0-9_.-]", "-", launch))


def _add_backend(tracking: Any, reduces: Mapping[str, Reduce] | None) -> None:
    if BACKEND in tracking.supported_backend:
        return
    tracking.supported_backend = [*tracking.supported_backend, BACKEND]
    original_init = tracking.__init__

    @functools.wraps(original_init)
    def tracking_init(
        self: Any, project_name: Any, experiment_name: Any, default_backend: Any = "console", config: Any = None
    ) -> None:
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        original_init(self, project_name, experiment_name, [b for b in backends if b != BACKEND], config)
        if BACKEND in backends:
            self.logger[BACKEND] = RankscopeVerlLogger(reduces)

    original_finish = tracking.finish

    @functools.wraps(original_finish)
    def tracking_finish(self: Any, *args: Any, **kwargs: Any) -> None:
        ours = getattr(self, "logger", {}).get(BACKEND)
        original_finish(self, *args, **kwargs)
        if isinstance(ours, RankscopeVerlLogger):
            ours.finish()

    tracking.__init__ = tracking_init
    tracking.finish = tracking_finish


def _time_worker_methods(decorator: Any) -> None:
    """verl's ``@register`` (how a worker method is offered to the trainer), timing the method.

    Worker classes are loaded in their Ray process after this hook, so theirs is this one."""
    original = decorator.register
    if getattr(original, "rankscope", False):
        return

    @functools.wraps(original)
    def register(*args: Any, **kwargs: Any) -> Any:
        verl_decorate = original(*args, **kwargs)
        return lambda method: verl_decorate(_timed(method))

    register.rankscope = True  # type: ignore[attr-defined]
    decorator.register = register


def _timed(method: Callable[..., Any]) -> Callable[..., Any]:
    name = method.__name__
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def timed_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            _join(self)
            with trace(name):
                return await method(self, *args, **kwargs)

        return timed_async

    @functools.wraps(method)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        _join(self)
        with trace(name):
            return method(self, *args, **kwargs)

    return timed


class WorkerProcesses:
    """The worker processes this trainer created, driven by its steps as a Monarch controller's
    actors are: its ``flush(N)`` closes step N in each (what a worker recorded during step N's
    calls is stamped N there), and ``Tracking.finish`` waits for each to deliver what it holds
    before verl tears the workers down."""

    def __init__(self) -> None:
        self._groups: weakref.WeakSet[Any] = weakref.WeakSet()

    def install(self, worker: Any, worker_group: Any) -> None:
        """Give verl's ``Worker`` the two calls, and follow every ``RayWorkerGroup`` built here."""
        if hasattr(worker, "rankscope_flush"):
            return

        def rankscope_flush(self: Any, step: int) -> None:
            _join(self)
            flush_driven(step)

        def rankscope_drain(self: Any, timeout: float) -> bool:
            return force_flush(timeout)

        worker.rankscope_flush = rankscope_flush  # on the base class: verl's workers load after this hook
        worker.rankscope_drain = rankscope_drain
        original_init, groups = worker_group.__init__, self._groups

        @functools.wraps(original_init)
        def group_init(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            groups.add(self)

        worker_group.__init__ = group_init
        drive_processes(self.flush)

    def actors(self) -> list[Any]:
        """Each worker process once (colocated roles share processes)."""
        found = {}
        for group in list(self._groups):
            for actor in getattr(group, "workers", None) or []:
                found[actor._actor_id] = actor
        return list(found.values())

    def flush(self, step: int) -> int:
        actors = self.actors()
        for actor in actors:
            actor.rankscope_flush.remote(step)  # after this thread's calls to it (Ray keeps their order)
        return len(actors)

    def drain(self, timeout: float) -> None:
        import ray

        pending = [actor.rankscope_drain.remote(timeout) for actor in self.actors()]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=timeout + 1.0)


workers = WorkerProcesses()


_joined: list[str] = []


def _join(worker: Any) -> None:
    """The first timed call in a worker process names the process's role after the worker's."""
    if _joined:
        return
    role = getattr(worker, "role", None)
    if not isinstance(role, str) or not role:
        role = re.sub(r"(?<!^)(?=[A-Z])", "_", type(worker).__name__.removesuffix("Worker")).lower() or "worker"
    _joined.append(role)
    try:
        init(role=os.environ.get("RANKSCOPE_ROLE") or role)
        follow_driver()  # the trainer's flush closes this process's steps
    except Exception as exc:
        report_internal_error("verl worker", exc)
