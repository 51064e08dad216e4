"""verl: ``trainer.logger=['console','rankscope']``, and verl's workers as processes of their roles.

One setting on verl's command line does both, in every process of the Ray job (docs/verl.md
adds the ``RANKSCOPE_*`` variables through ``runtime_env.env_vars``)::

    python -m verl.trainer.main_ppo ... 'trainer.logger=[console,rankscope]' \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rankscope.verl.register

Ray calls ``register`` as each of the job's processes starts (verl passes its ``ray_init``
settings on), before verl's classes are loaded there. It

- adds ``rankscope`` to ``Tracking``'s fixed list of backends (verl builds ``Tracking`` inside the
  Ray actor that runs the trainer): every number the trainer logs at a global step (its workers'
  metrics, gathered under their role's prefix: ``actor/pg_loss``, ``critic/score/mean``,
  ``timing_s/gen``, validation's ``val-core/...``) is recorded at that step, which is closed as it
  is logged (verl's PPO trainers log a step once, at its end; a second log of a closed step is
  not recorded, with one warning);
- times every method verl's workers register for the trainer to call (``update_actor``,
  ``compute_log_prob``, ``compute_ref_log_prob``, ...; verl's ``@register``): in each worker
  process, a span and ``<key>/<method>/total_duration_avg_s``/``_max_s`` (verl's role key:
  ``actor_rollout/update_actor``), in a process named by its role keys and rank. The
  trainer drives its workers' steps as a Monarch controller drives its actors: its flush of step
  N closes step N in every worker process it created (``WorkerProcesses``);
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
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar
from typing import Any

from ..api import flush, force_flush, init, set_step, trace
from ..core import runtime as _slot
from ..core.errors import report_internal_error, warn_once
from ..lifecycle import drive_processes, flush_driven, follow_driver
from ..metrics.recording import record_logged
from ..metrics.reduce import Reduce

SOURCE = "rankscope.verl"
"""How warnings name this adapter: the short name users import (``rankscope.verl``)."""

BACKEND = "rankscope"


class RankscopeVerlLogger:
    """One of verl's tracking backends (``log(data, step)``, ``finish()``), on the trainer's process."""

    def __init__(self, reduces: Mapping[str, Reduce] | None = None) -> None:
        if _slot.current is None:  # not set up yet in this process: it is the trainer
            init(role=os.environ.get("RANKSCOPE_ROLE") or "trainer")
        self._reduces = dict(reduces or {})
        self._closed: int | None = None
        self._finished = False

    def log(self, data: Mapping[str, Any], step: int) -> None:
        try:
            step = int(step)
            if self._closed is not None and step <= self._closed:
                warn_once(f"rankscope.verl: verl logged step {step} after step {self._closed} closed; not recorded")
                return
        except Exception as exc:
            report_internal_error("verl tracking", exc)
            return
        try:
            set_step(step)
            for key, value in data.items():
                record_logged(key, value, self._reduces.get(str(key), Reduce.MEAN), source=SOURCE)
        finally:
            self._closed = step
            try:
                flush(step)  # verl's PPO trainers log a step once, at its end
            except Exception as exc:  # telemetry never breaks the training loop
                report_internal_error("verl tracking", exc)

    def finish(self, timeout: float = 5.0) -> None:
        """The end of training: the workers and this process deliver what they hold (once; never
        while the interpreter shuts down, where verl's ``__del__`` may call it)."""
        if self._finished or sys.is_finalizing():
            return
        self._finished = True
        try:
            workers.drain(timeout)
            force_flush(timeout)
        except Exception as exc:
            report_internal_error("verl tracking finish", exc)


def register(reduces: Mapping[str, Reduce] | None = None) -> None:
    """Set up rankscope for verl in this process (see the module docstring); idempotent.

    A Ray setup hook runs in every process of the job, verl's or not: without verl, nothing. It
    never raises (Ray ends a process whose setup hook raised): trouble is reported, verl runs on."""
    try:
        import verl  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name == "verl":
            return
        report_internal_error("rankscope.verl: importing verl", exc)
        return
    try:
        from verl.single_controller import ray as verl_ray
        from verl.single_controller.base import Worker, decorator
        from verl.utils.tracking import Tracking

        _pin_ray_job(os.environ)
        _add_backend(Tracking, reduces)
        _time_worker_methods(decorator)
        _name_colocated_roles(verl_ray)
        workers.install(Worker, verl_ray.RayWorkerGroup)
    except Exception as exc:
        report_internal_error("rankscope.verl: setting up for verl", exc)


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


_inside: ContextVar[bool] = ContextVar("rankscope_verl_inside", default=False)


def _timed(method: Callable[..., Any]) -> Callable[..., Any]:
    """Times the outermost registered call only: verl's workers call each other's (an
    ``ActorRolloutRefWorker`` its ``TrainingWorker``'s) in the same process."""
    name = getattr(method, "__name__", "call")
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def timed_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _inside.get():
                return await method(self, *args, **kwargs)
            token = _inside.set(True)
            try:
                _join(self)
                with trace(_span_name(self, name)):
                    return await method(self, *args, **kwargs)
            finally:
                _inside.reset(token)

        return timed_async

    @functools.wraps(method)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _inside.get():
            return method(self, *args, **kwargs)
        token = _inside.set(True)
        try:
            _join(self)
            with trace(_span_name(self, name)):
                return method(self, *args, **kwargs)
        finally:
            _inside.reset(token)

    return timed


def _span_name(worker: Any, method: str) -> str:
    key = getattr(worker, _KEY, None)
    return f"{key}/{method}" if isinstance(key, str) and key else method


_KEY, _ROLE = "_rankscope_key", "_rankscope_role"


def _name_colocated_roles(verl_ray: Any) -> None:
    """verl puts several roles in one process (``create_colocated_worker_cls``: a ``WorkerDict``
    holding one worker per role key). Tag each inner worker with its key, and the process with all
    of them (``actor_rollout+critic``), so names say whose call it was."""
    from verl.single_controller.ray import base

    original = base.create_colocated_worker_cls
    if getattr(original, "rankscope", False):
        return

    @functools.wraps(original)
    def create_colocated_worker_cls(*args: Any, **kwargs: Any) -> Any:
        import ray

        made = original(*args, **kwargs)
        colocated = made.cls.__ray_actor_class__

        class WorkerDict(colocated):  # type: ignore[misc,valid-type]
            def __init__(self) -> None:
                super().__init__()
                role = "+".join(self.worker_dict)
                setattr(self, _ROLE, role)
                for key, inner in self.worker_dict.items():
                    setattr(inner, _KEY, key)
                    setattr(inner, _ROLE, role)

        WorkerDict.__qualname__ = colocated.__qualname__
        made.cls = ray.remote(WorkerDict)  # Ray has already taken verl's class as it was
        return made

    create_colocated_worker_cls.rankscope = True  # type: ignore[attr-defined]
    base.create_colocated_worker_cls = create_colocated_worker_cls
    if getattr(verl_ray, "create_colocated_worker_cls", None) is original:
        verl_ray.create_colocated_worker_cls = create_colocated_worker_cls


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
_join_lock = threading.Lock()


def _join(worker: Any) -> None:
    """The first call in a worker process names the process's role after its worker(s): verl's
    colocated role keys, else the worker's ``role``, else its class (``CriticWorker`` → ``critic``)."""
    if _joined:
        return
    with _join_lock:
        if _joined:
            return
        role = getattr(worker, _ROLE, None) or getattr(worker, "role", None)
        if not isinstance(role, str) or not role:
            role = re.sub(r"(?<!^)(?=[A-Z])", "_", type(worker).__name__.removesuffix("Worker")).lower() or "worker"
        try:
            init(role=os.environ.get("RANKSCOPE_ROLE") or role)
            follow_driver()  # the trainer's flush closes this process's steps
        except Exception as exc:
            report_internal_error("verl worker", exc)
        _joined.append(role)
