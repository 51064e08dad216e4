"""A Lightning DDP run on CPU (2 processes) whose ``self.log`` values go to rankscope (tests/test_lightning.py).

Usage: python lightning_ddp.py STEPS [EXPERIMENT [crash]]

With EXPERIMENT, the script starts with ``rs.init(experiment=EXPERIMENT)`` as a newcomer's does:
before ``trainer.fit``, so Lightning's launcher makes this process rank 0 after rankscope started.
With ``crash``, it logs every 5 steps and rank 1 raises in batch 12, a step it logs nothing in.
"""

from __future__ import annotations

import sys

import lightning
import torch
from torch.utils.data import DataLoader, TensorDataset

import rankscope as rs
from rankscope.lightning import RankscopeLogger


class Tiny(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if CRASH and batch_idx == 12 and self.global_rank == 1:
            raise RuntimeError("boom at 12")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train/rank", float(self.global_rank))  # per rank: the sink's MEAN over 2 ranks is 0.5
        self.log("train/rank_max", float(self.global_rank))  # MAX by the logger's reduces: 1.0
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


CRASH = sys.argv[3:4] == ["crash"]

if __name__ == "__main__":
    steps = int(sys.argv[1])
    if len(sys.argv) > 2:
        rs.init(experiment=sys.argv[2])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=steps,
        log_every_n_steps=5 if CRASH else 1,
        logger=RankscopeLogger(reduces={"train/rank_max": rs.Reduce.MAX}),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    rs.shutdown()
