"""A Hugging Face Trainer on a tiny model built here (no downloads), with RankscopeCallback.

argv: steps. Prints the Trainer's log history as JSON on its last line.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch
from transformers import Trainer, TrainingArguments

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


torch.manual_seed(0)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out,
        max_steps=int(sys.argv[1]),
        per_device_train_batch_size=8,
        logging_steps=1,
        learning_rate=0.05,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=Tiny(), args=args, train_dataset=Data(), callbacks=[RankscopeCallback()])
    trainer.train()
rs.shutdown()
print(json.dumps(trainer.state.log_history))
