"""Hugging Face Transformers: what the ``Trainer`` logs lands in the rankscope experiment.

    from transformers import Trainer
    from rankscope.huggingface import RankscopeCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[RankscopeCallback()])

The Trainer calls its callbacks on every process. Each process's ``RankscopeCallback`` records
the numbers of every ``on_log`` (loss, learning rate, grad norm, eval metrics ...) with
``record_metric`` at the Trainer's ``global_step``, and the sink reduces across processes: MEAN
unless ``reduces`` names another reduce type for a key (the Trainer's logged loss is already
averaged over processes, so its mean is itself). A step is closed (``flush``) when a later
global step logs, and at the end of training; logs of one global step (training and
evaluation) arrive as one step. Non-numeric entries are skipped; a key that is not a valid
metric name is renamed by one rule (``metrics.recording.record_logged``).

Needs ``transformers`` (``pip install transformers accelerate``); rankscope itself does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from ..api import flush
from ..lifecycle.assemble import follow_launcher
from ..metrics.recording import record_logged
from ..metrics.reduce import Reduce

SOURCE = "rankscope.huggingface"
"""How warnings name this adapter: the short name users import (``rankscope.huggingface``)."""


class RankscopeCallback(TrainerCallback):
    """A Trainer callback that records the Trainer's logs into the process's rankscope experiment."""

    def __init__(self, reduce: Reduce = Reduce.MEAN, reduces: Mapping[str, Reduce] | None = None) -> None:
        self._reduce = reduce
        self._reduces = dict(reduces or {})
        self._open: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        follow_launcher()  # a launcher that made this process a rank after rankscope started in it

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
