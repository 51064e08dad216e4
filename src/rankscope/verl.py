"""verl: ``trainer.logger=['console','rankscope']`` records verl's metrics in the rankscope experiment.

verl's ``Tracking`` knows its backends by a fixed list and builds them itself; ``register()`` adds
``rankscope`` to that list in the process that calls it. verl builds its ``Tracking`` inside the
Ray actor that runs the trainer, so register there: Ray calls a setup hook in each process of the
job when the runtime environment names one, and verl passes its ``ray_init`` settings on::

    python -m verl.trainer.main_ppo ... 'trainer.logger=[console,rankscope]' \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rankscope.verl.register

(a driver of your own calls ``rankscope.verl.register()`` before it builds ``Tracking``).

What verl logs at a global step (its workers' metrics, already gathered by the trainer under their
role's prefix: ``actor/pg_loss``, ``critic/score/mean``, ``response_length/mean``,
``timing_s/gen``, ``timing_s/ref``, ``timing_s/update_actor``, validation's ``val-core/...``) is
recorded at that step, and the trainer's step drives rankscope's: step N is closed when verl logs
a later step, and at ``Tracking.finish``. Keys OTel does not take are renamed by one rule
(``mean@4`` → ``mean_at4``). Without ``RANKSCOPE_EXPERIMENT`` the experiment is verl's
``trainer.experiment_name``. Needs ``verl`` (read from 0.9.1); rankscope imports it only here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from numbers import Real
from typing import Any

from .api import init, record_metric
from .core.errors import report_internal_error, warn_once
from .metrics.reduce import Reduce
from .metrics.values import as_metric_name
from .stepping import StepFollower

BACKEND = "rankscope"


class RankscopeVerlLogger:
    """One of verl's tracking backends (``log(data, step)``, ``finish()``), on the trainer's process."""

    def __init__(self, experiment_name: str | None = None, reduces: Mapping[str, Reduce] | None = None) -> None:
        if experiment_name and not os.environ.get("RANKSCOPE_EXPERIMENT"):
            init(experiment=str(experiment_name), role=os.environ.get("RANKSCOPE_ROLE") or "trainer")
        self._reduces = dict(reduces or {})
        self._step = StepFollower()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        try:
            self._step.follow(int(step))
            for key, value in data.items():
                self._record(key, value)
        except Exception as exc:  # telemetry never breaks the training loop
            report_internal_error("verl tracking", exc)

    def _record(self, key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, Real):
            return  # verl also logs strings and tables to some backends: numbers only here
        name = as_metric_name(str(key))
        if name is None:
            warn_once(f"rankscope.verl: {key!r} has no valid metric name; not recorded")
            return
        record_metric(name, float(value), self._reduces.get(str(key), Reduce.MEAN))

    def finish(self) -> None:
        self._step.close()


def register(reduces: Mapping[str, Reduce] | None = None) -> None:
    """Make ``rankscope`` one of verl's tracking backends in this process (idempotent).

    Imports verl only if this process has it: as a Ray setup hook, it runs in every process of
    the job, verl's or not."""
    try:
        from verl.utils.tracking import Tracking
    except ImportError:
        return
    if BACKEND in Tracking.supported_backend:
        return
    Tracking.supported_backend = [*Tracking.supported_backend, BACKEND]
    original_init, original_finish = Tracking.__init__, Tracking.finish

    @functools.wraps(original_init)
    def tracking_init(
        self: Any, project_name: Any, experiment_name: Any, default_backend: Any = "console", config: Any = None
    ) -> None:
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        ours = BACKEND in backends
        original_init(self, project_name, experiment_name, [b for b in backends if b != BACKEND], config)
        if ours:
            self.logger[BACKEND] = RankscopeVerlLogger(experiment_name, reduces)

    @functools.wraps(original_finish)
    def tracking_finish(self: Any, *args: Any, **kwargs: Any) -> None:
        ours = getattr(self, "logger", {}).get(BACKEND)
        original_finish(self, *args, **kwargs)
        if isinstance(ours, RankscopeVerlLogger):
            ours.finish()

    Tracking.__init__ = tracking_init  # type: ignore[method-assign]
    Tracking.finish = tracking_finish  # type: ignore[method-assign]
