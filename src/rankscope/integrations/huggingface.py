"""Hugging Face Transformers: what the ``Trainer`` logs lands in the rankscope experiment.

    from transformers import Trainer
    from rankscope.huggingface import RankscopeCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[RankscopeCallback()])

The Trainer calls its callbacks on every process. Each process's ``RankscopeCallback`` records
the numbers of every ``on_log`` (loss, learning rate, grad norm, eval metrics ...) with
``record_metric`` at the Trainer's ``global_step``, and the sink reduces across processes: MEAN
unless ``reduces`` names another reduce type for a key (the Trainer's logged loss is already
averaged over processes, so its mean is itself). rankscope's steps are the Trainer's logged
steps: the training steps since the last log belong to the step that logs next (with
``logging_steps=10``, steps 11-20 are step 20: their time, collectives and spans; ``set_step``
at each step's start), and a logged step is closed (``flush``) when the next training step
begins, or at the end of training, so logs of one global step (training and evaluation) arrive
as one step. Logging by epoch, the steps between logs take the number after the last logged one.
Non-numeric entries are skipped; a key that is not a valid metric name is renamed by one rule
(``metrics.recording.record_logged``). The keys keep the order the Trainer logged them in (``loss``,
``grad_norm``, ``learning_rate``, ``epoch``) in every view.

The Trainer prints each log itself too: ``{'loss': ..., 'grad_norm': ..., ...}``, from its
``ProgressCallback`` (under its tqdm bar) or, with ``disable_tqdm=True``, its ``PrinterCallback``.
While rankscope prints the steps on this terminal as well (its console view: a lone process's, or
the one of the job's embedded sink or ``rankscope run``), the callback quiets that printing of the
Trainer it is in, so each step's numbers are printed once, by rankscope: those two callbacks stay in
the Trainer's list (``trainer.callback_handler.callbacks``) and do everything else they did (the
tqdm bars stay), only their ``on_log`` prints nothing. With the console off (``RANKSCOPE_CONSOLE=off``,
views that name no console, a sink elsewhere) the Trainer prints as it always does. Subclasses of
those callbacks, and the notebook's progress table, are left as they are.

Needs ``transformers`` (``pip install transformers accelerate``); rankscope itself does not.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler, PrinterCallback, ProgressCallback

from ..api import flush, set_step
from ..core.errors import report_internal_error
from ..lifecycle.assemble import follow_launcher
from ..lifecycle.driving import prints_steps_here
from ..metrics.recording import record_logged
from ..metrics.reduce import Reduce

SOURCE = "rankscope.huggingface"
"""How warnings name this adapter: the short name users import (``rankscope.huggingface``)."""


class RankscopeCallback(TrainerCallback):
    """A Trainer callback that records the Trainer's logs into the process's rankscope experiment,
    and quiets the Trainer's own printing of them while rankscope's console prints them (the module
    docstring says when and how)."""

    def __init__(self, reduce: Reduce = Reduce.MEAN, reduces: Mapping[str, Reduce] | None = None) -> None:
        self._reduce = reduce
        self._reduces = dict(reduces or {})
        self._open: int | None = None

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _quiet_printers(_calling_handler())

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _quiet_printers(_calling_handler())  # also when added after the Trainer was built (add_callback)
        follow_launcher()  # a launcher that made this process a rank after rankscope started in it

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A training step begins: the logged step before it is complete (its evaluation logs
        too), and what this step records, times and traces belongs to the step that logs next."""
        if self._open is not None:
            flush(self._open)
            self._open = None
        coming = next_logged_step(args, state)
        if coming is not None:
            set_step(coming)

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        step = int(state.global_step)
        if self._open is not None and step != self._open:
            flush(self._open)
        self._open = step
        for key, value in (logs or {}).items():
            record_logged(key, value, self._reduces.get(key, self._reduce), source=SOURCE)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._open is not None:
            flush(self._open)
            self._open = None


def next_logged_step(args: Any, state: Any) -> int | None:
    """The global step the Trainer logs next, from the one about to run on (its
    ``DefaultFlowCallback`` rule: every ``logging_steps``, the first with ``logging_first_step``,
    the last); None when it logs by epoch or not at all (the steps between then take the number
    after the last flushed one)."""
    try:
        coming = int(state.global_step) + 1
        if coming == 1 and getattr(args, "logging_first_step", False):
            return 1
        if str(getattr(args, "logging_strategy", "")).rsplit(".", 1)[-1].lower() != "steps":
            return None
        every = int(state.logging_steps or 0)
        if every <= 0:
            return None
        logged = -(-coming // every) * every
        last = int(state.max_steps or 0)
        return min(logged, last) if last > 0 else logged
    except (TypeError, ValueError, AttributeError):
        return None


PRINTERS: tuple[type[TrainerCallback], ...] = (PrinterCallback, ProgressCallback)
"""The Trainer's default callbacks whose ``on_log`` prints the logs dict (exactly these types)."""


class QuietOnLog:
    """A printing callback's ``on_log`` that prints only while rankscope's console does not (the
    callback's instance attribute, over its class's method: that one Trainer only)."""

    def __init__(self, on_log: Callable[..., Any], pops_flos: bool) -> None:
        self.on_log = on_log
        self.pops_flos = pops_flos

    def __call__(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        try:
            quiet = prints_steps_here()
        except Exception as exc:  # never into the Trainer's loop: it prints as it would without rankscope
            report_internal_error("the Trainer's printing", exc)
            quiet = False
        if not quiet:
            return self.on_log(args, state, control, logs=logs, **kwargs)
        if self.pops_flos and logs is not None:
            logs.pop("total_flos", None)  # as PrinterCallback does, for the callbacks after it
        return None


def _calling_handler() -> CallbackHandler | None:
    """The Trainer's ``CallbackHandler`` whose ``call_event`` called the event this is called from:
    it calls each callback's method itself, so it is the frame two up (or a few more, through a
    subclass's method calling ``super()``); None when none of them is one."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            break
        handler = frame.f_locals.get("self")
        if isinstance(handler, CallbackHandler):
            return handler
        frame = frame.f_back
    return None


def _quiet_printers(handler: CallbackHandler | None) -> None:
    """Give the handler's printing callbacks a ``QuietOnLog`` (once each)."""
    for callback in [] if handler is None else handler.callbacks:
        if type(callback) in PRINTERS and not isinstance(vars(callback).get("on_log"), QuietOnLog):
            callback.on_log = QuietOnLog(callback.on_log, pops_flos=type(callback) is PrinterCallback)
