"""PyTorch Lightning: ``self.log(...)`` lands in the rankscope experiment.

    import lightning
    from rankscope.lightning import RankscopeLogger

    trainer = lightning.Trainer(strategy="ddp", logger=RankscopeLogger())

Lightning calls its loggers on every rank. Each rank's ``RankscopeLogger`` records what it is
handed with ``record_metric`` at Lightning's step, and the sink reduces across ranks: MEAN unless
``reduces`` names another reduce type for a key (a value logged with ``sync_dist=True`` is the
same on every rank, so its mean is itself). rankscope's steps are Lightning's logged steps: the
batches since the last log belong to the step Lightning logs next (with ``log_every_n_steps=50``,
batches 50-99 are step 99: their time, collectives and spans; ``set_step`` at each batch's start,
from a ``BatchSteps`` callback the logger adds to its Trainer at fit's start, since Lightning
gives a logger no batch hooks), and a logged step is closed (``flush``) when the next batch
begins, and at ``finalize``: training and validation values logged at one step arrive as one
step. Hyperparameters are not logged (the views have no place for them yet). Building the logger
pins the run (``rankscope.run.id``) for the ranks Lightning's DDP launcher starts afterwards, so
all ranks of one launch are one run. Under plain ``python``, that launcher makes the launching
process rank 0 after rankscope may have started in it as a lone process: the logger's first call
re-initializes it as rank 0 (``lifecycle.assemble.follow_launcher``), and the ranks share the
experiment's embedded sink as torchrun's do.

The keys keep the order Lightning hands them in, which is the order ``self.log`` logged them
(``self.log("loss")`` then ``self.log("acc")``: ``loss`` before ``acc`` in every view), Lightning's
``epoch`` after them. A key that is not a valid metric name is recorded under one by rankscope's
rule (``acc(%)`` as ``acc_pct``, ``metrics.values.as_metric_name``), and rank 0 says so once per
key on stderr: ``rankscope: Lightning key 'acc(%)' is recorded as 'acc_pct'``.

Needs ``lightning`` (``pip install lightning``); rankscope itself does not.
"""

from __future__ import annotations

import os
import sys
from argparse import Namespace
from collections.abc import Mapping
from types import FrameType
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger

from ..api import flush, get_resource, set_step
from ..backends.console import write_line
from ..core import names as attr
from ..core.errors import report_internal_error
from ..core.identity import pin_run
from ..lifecycle.assemble import follow_launcher
from ..metrics.recording import record_logged
from ..metrics.reduce import Reduce
from ..metrics.values import as_metric_name

SOURCE = "rankscope.lightning"
"""How warnings name this adapter: the short name users import (``rankscope.lightning``)."""

MAX_SEEN_KEYS = 10_000
"""Keys whose name this process checked (each is said once); keys past it are not said."""

_seen: set[str] = set()
"""The keys this process has checked for a rename: one note per key per process, whatever the
number of loggers or fits."""


class RankscopeLogger(Logger):
    """A Lightning logger that records into the process's rankscope experiment."""

    def __init__(self, reduce: Reduce = Reduce.MEAN, reduces: Mapping[str, Reduce] | None = None) -> None:
        super().__init__()
        pin_run(os.environ)  # before Lightning starts the other ranks: they inherit this launch's run
        self._reduce = reduce
        self._reduces = dict(reduces or {})
        self._open: int | None = None
        self._followed = False

    @property
    def name(self) -> str:
        return "rankscope"

    @property
    def version(self) -> str | None:
        """This launch's run id (each fit a run, as each of Lightning's versions; its progress bar
        shows the last 4 characters as ``v_num``, random hex for a generated id), else the
        experiment id; None when rankscope is disabled."""
        resource = get_resource()
        if resource is None:
            return None
        found = resource.attributes.get(attr.RUN_ID) or resource.attributes.get(attr.EXPERIMENT_ID)
        return None if found is None else str(found)

    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        pass

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Called at fit's start, from ``_log_hyperparams(trainer)``: the Trainer is followed from
        its first batch (``BatchSteps``); no graph is logged."""
        _follow_batches(self, _calling_trainer())

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self._followed:  # Lightning's launcher ran: this process may have become a rank since
            self._followed = True
            follow_launcher()
            _follow_batches(self, _calling_trainer())  # not followed yet (``enable_autolog_hparams=False``)
        if step is not None and self._open is not None and step != self._open:
            flush(self._open)
        if step is not None:
            self._open = step
        for key, value in metrics.items():  # Lightning's order is the logged one: recorded in it
            if key not in _seen:
                _say_renamed(key)
            record_logged(key, value, self._reduces.get(key, self._reduce), source=SOURCE)

    def batch_starts(self, trainer: Any) -> None:
        """A training batch begins (``BatchSteps``): the logged step before it is complete (its
        validation logs too), and what this batch records, times and traces belongs to the step
        Lightning logs next."""
        if self._open is not None:
            flush(self._open)
            self._open = None
        coming = next_logged_step(trainer)
        if coming is not None:
            set_step(coming)

    def finalize(self, status: str) -> None:
        if self._open is not None:
            flush(self._open)
            self._open = None


class BatchSteps(Callback):
    """The logger's view of each training batch's start (Lightning tells loggers only what is
    logged): added to the Trainer's callbacks by the logger itself, once."""

    def __init__(self, logger: RankscopeLogger) -> None:
        self.logger = logger

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        try:
            self.logger.batch_starts(trainer)
        except Exception as exc:  # never into the training loop
            report_internal_error("Lightning batch start", exc)


def next_logged_step(trainer: Any) -> int | None:
    """The step Lightning logs next, from the batch about to run on: it logs when the batches that
    stepped so far plus one are a multiple of ``log_every_n_steps``, at that count (so with 5:
    steps 4, 9, 14 ...), and at the last step; None when it does not log by steps."""
    try:
        every = int(trainer.log_every_n_steps)
        if every <= 0:
            return None
        stepped = int(trainer.fit_loop.epoch_loop._batches_that_stepped)
        logged = -(-(stepped + 1) // every) * every - 1
        last = int(trainer.max_steps)
        return min(logged, last - 1) if last > 0 else logged
    except (AttributeError, TypeError, ValueError):
        return None


def _calling_trainer() -> Any:
    """The Trainer whose code called the logger (a ``trainer`` local, or its logger connector's
    ``self.trainer``, a few frames up): Lightning gives a logger no reference to it."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        local = frame.f_locals
        found = local.get("trainer")
        if found is None:
            found = getattr(local.get("self"), "trainer", None)
        if isinstance(found, Trainer):
            return found
        frame = frame.f_back
    return None


def _follow_batches(logger: RankscopeLogger, trainer: Any) -> None:
    """Add the logger's ``BatchSteps`` to ``trainer``'s callbacks, once per Trainer."""
    if trainer is None:
        return
    callbacks = getattr(trainer, "callbacks", None)
    if isinstance(callbacks, list) and not any(isinstance(c, BatchSteps) and c.logger is logger for c in callbacks):
        callbacks.append(BatchSteps(logger))


def _say_renamed(key: str) -> None:
    """Say once, on stderr and from rank 0 only, that ``key`` is recorded under another name."""
    if len(_seen) >= MAX_SEEN_KEYS:
        return
    _seen.add(key)
    name = as_metric_name(str(key))
    if name is None or name == key:
        return  # valid as it is, or not recorded at all (``record_logged`` warns)
    resource = get_resource()
    if resource is None or str(resource.attributes.get(attr.RANK, "0")) != "0":
        return
    write_line(sys.stderr, f"rankscope: Lightning key {key!r} is recorded as {name!r}")
