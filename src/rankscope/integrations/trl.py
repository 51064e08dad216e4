"""TRL: a ``GRPOTrainer``'s logs, completions and phases land in the rankscope experiment.

    from trl import GRPOTrainer
    import rankscope.trl

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=prompts)
    rankscope.trl.instrument(trainer)
    trainer.train()

On every process of the job:

- the trainer's logged metrics (``reward``, ``reward_std``, ``kl``, ``completions/mean_length``,
  ``loss``, ...) are recorded at the trainer's global step (``RankscopeCallback``), MEAN across
  processes unless ``reduces`` says otherwise (TRL has averaged them over processes already);
- each generation's completions *of this process* go to the sample table ``grpo/completions``:
  ``prompt``, ``completion``, ``reward`` (the weighted sum over the reward functions, as TRL
  computes it), ``advantage`` and one column per reward function, ranked by reward: the k best
  and k worst completions of the step across every process, exactly, each with its provenance
  (step, rank, role, trace);
- the step's trace holds its phases in order: ``grpo/generate`` (sampling completions),
  ``grpo/score`` (the reward functions) and ``grpo/train`` (loss, backward), with their duration
  metrics (``grpo/generate/total_duration_avg_s`` and ``_max_s`` ...).

A global step is closed (``flush``) when the next one begins and at the end of training, so the
step's phases, records and logs share its number. What this reads of the trainer that is not
public API (its ``_generate``, ``_calculate_rewards``, ``_generate_and_score_completions`` and
``_prepare_inputs`` methods, ``reward_weights``, ``reward_func_names``) is read from TRL 1.16; a
trainer without one of them is not patched there, with one warning, and the rest still works.
Needs ``trl`` (``pip install trl``); rankscope itself does not, and imports it only here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from ..api import Tracer, flush, record_sample, set_step, trace
from ..core.errors import report_internal_error, warn_once
from ..metrics.recording import record_logged
from ..metrics.reduce import Reduce
from .huggingface import RankscopeCallback

SOURCE = "rankscope.trl"
"""How warnings name this adapter: the short name users import (``rankscope.trl``)."""

TABLE = "grpo/completions"
_PATCHED = ("_generate", "_calculate_rewards", "_generate_and_score_completions", "_prepare_inputs", "training_step")


class RankscopeGRPOCallback(RankscopeCallback):
    """``RankscopeCallback`` whose step closes when the next global step begins (a step's phases run
    before its log), and which holds the step's open ``grpo/train`` phase."""

    def __init__(self, reduce: Reduce = Reduce.MEAN, reduces: Mapping[str, Reduce] | None = None) -> None:
        super().__init__(reduce, reduces)
        self.training: Tracer | None = None
        self._flushed = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        done = int(state.global_step)
        self._close(done)
        set_step(done + 1)  # the coming step's spans are in its trace

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        for key, value in (logs or {}).items():  # step ``global_step``'s: it closes at the next step's begin
            record_logged(key, value, self._reduces.get(key, self._reduce), source=SOURCE)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close(int(state.global_step))

    def _close(self, step: int) -> None:
        if step > self._flushed:
            flush(step)
            self._flushed = step


def instrument(
    trainer: Any, *, k: int = 8, table: str = TABLE, reduces: Mapping[str, Reduce] | None = None
) -> RankscopeGRPOCallback:
    """Record ``trainer``'s logs, completions and phases (see the module docstring); returns the callback added."""
    callback = RankscopeGRPOCallback(reduces=reduces)
    trainer.add_callback(callback)
    missing = [name for name in _PATCHED if not callable(getattr(trainer, name, None))]
    if missing:
        warn_once(
            f"rankscope.trl: this GRPOTrainer has no {', '.join(missing)} (rankscope read TRL 1.16); "
            "its phases and completions are not recorded, its logged metrics are"
        )
        return callback
    scored: list[tuple[list[Any], list[Any], Any]] = []

    def generate(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with trace("grpo/generate"):
            return original(*args, **kwargs)

    def score(original: Callable[..., Any], inputs: Any, prompts: Any, completions: Any, *args: Any) -> Any:
        with trace("grpo/score"):
            rewards = original(inputs, prompts, completions, *args)
        scored.append((list(prompts), list(completions), rewards))
        return rewards

    def generate_and_score(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        scored.clear()
        output = original(*args, **kwargs)
        if scored:
            try:
                _record_completions(trainer, *scored[-1], output.get("advantages"), table, k)
            except Exception as exc:
                report_internal_error("TRL completions", exc)
        scored.clear()
        return output

    def prepare_inputs(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        inputs = original(*args, **kwargs)  # generation and scoring, when this step generates
        if trainer.model.training and callback.training is None:
            callback.training = Tracer("grpo/train").start()
        return inputs

    def training_step(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            if callback.training is not None:
                callback.training.stop()
                callback.training = None

    for name, wrapper in (
        ("_generate", generate),
        ("_calculate_rewards", score),
        ("_generate_and_score_completions", generate_and_score),
        ("_prepare_inputs", prepare_inputs),
        ("training_step", training_step),
    ):
        _wrap(trainer, name, wrapper)
    return callback


def _wrap(trainer: Any, name: str, wrapper: Callable[..., Any]) -> None:
    original = getattr(trainer, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    setattr(trainer, name, wrapped)  # on this trainer only: the class is untouched


def _record_completions(
    trainer: Any, prompts: list[Any], completions: list[Any], rewards: Any, advantages: Any, table: str, k: int
) -> None:
    """This process's completions of one generation, as rows ranked by their reward.

    ``rewards`` is TRL's gathered (all processes) rewards per function; this process's rows are its
    slice, as TRL slices its advantages."""
    n = len(prompts)
    start = int(trainer.accelerator.process_index) * n
    mine = rewards[start : start + n]
    weights = trainer.reward_weights.to(mine.device)
    totals = (mine * weights.unsqueeze(0)).nansum(dim=1).tolist()
    per_function = mine.tolist()
    names = list(trainer.reward_func_names)
    advantage = advantages.tolist() if advantages is not None else [None] * n
    for i in range(n):
        row: dict[str, Any] = {
            "prompt": _text(prompts[i]),
            "completion": _text(completions[i]),
            "reward": float(totals[i]),
        }
        adv = advantage[i]
        if adv is not None:
            row["advantage"] = float(adv)
        for name, value in zip(names, per_function[i], strict=True):
            if value == value:  # a function that returned None (NaN) for this row adds no column
                row[f"reward/{name}"] = float(value)
        record_sample(table, row, rank_by="reward", k=k)


def _text(value: Any) -> str:
    """A prompt or completion as text: a string, or a conversation's messages joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in value
        )
    return str(value)
