"""A Hugging Face Trainer on a tiny model built here (no downloads), with RankscopeCallback.

argv: steps, then optionally the logging interval (default 1) and a step that sleeps 0.4 s at its
end (default none). Prints the Trainer's log history as JSON on its last line, with the step
rankscope had in progress at each training step's end (``current_step``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import rankscope as rs
from rankscope.huggingface import RankscopeCallback


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


class Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=g)
        self.y = self.x.sum(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Watch(TrainerCallback):
    """After rankscope's callback: the step in progress at each training step's end; one slow step."""

    def __init__(self, slow: int) -> None:
        self.slow, self.current = slow, {}

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == self.slow:
            time.sleep(0.4)
        self.current[state.global_step] = rs.current_step()


logging_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
watch = Watch(int(sys.argv[3]) if len(sys.argv) > 3 else -1)
torch.manual_seed(0)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out,
        max_steps=int(sys.argv[1]),
        per_device_train_batch_size=8,
        logging_steps=logging_steps,
        learning_rate=0.05,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=Tiny(), args=args, train_dataset=Data(), callbacks=[RankscopeCallback(), watch])
    trainer.train()
rs.shutdown()
print(json.dumps({"history": trainer.state.log_history, "current": watch.current}))
