"""A one-process Lightning run that logs every 2 steps (tests/integration/test_lightning.py).

argv: the batch whose training step sleeps 0.4 s. Prints, on its last line as JSON, the step
rankscope had in progress at each training batch's end (``current_step``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import lightning
import torch
from torch.utils.data import DataLoader, TensorDataset

import rankscope as rs
from rankscope.lightning import RankscopeLogger

SLOW = int(sys.argv[1])


class Tiny(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.current: dict[int, int | None] = {}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if batch_idx == SLOW:
            time.sleep(0.4)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.current[batch_idx] = rs.current_step()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=6,
        log_every_n_steps=2,
        logger=RankscopeLogger(),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Tiny()
    trainer.fit(module, DataLoader(data, batch_size=4))
    rs.shutdown()
    print(json.dumps(module.current))
