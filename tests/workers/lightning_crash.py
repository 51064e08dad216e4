"""A Lightning DDP run on CPU (2 processes, ``python`` itself, not torchrun) that logs every 5 steps
and whose rank 1 raises in batch 12, a step it logs nothing in (tests/integration/test_lightning.py).

Usage: python lightning_crash.py EXPERIMENT
"""

from __future__ import annotations

import sys

import lightning
import torch
from torch.utils.data import DataLoader, TensorDataset

import rankscope as rs
from rankscope.lightning import RankscopeLogger


class Crashing(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if batch_idx == 12 and self.global_rank == 1:
            raise RuntimeError("boom at 12")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    rs.init(experiment=sys.argv[1])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=30,
        log_every_n_steps=5,
        logger=RankscopeLogger(),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Crashing(), DataLoader(data, batch_size=4))
    rs.shutdown()
