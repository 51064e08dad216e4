"""Two of verl's worker roles, small enough for a CPU: what ``examples/verl_tracking.py`` runs.

They are verl ``Worker`` classes whose methods are offered to the trainer with verl's own
``@register``, as ``ActorRolloutRefWorker``'s are; Ray loads this module in each worker process,
after ``rankscope.verl.register`` ran there, as it loads verl's workers.
"""

from __future__ import annotations

import time

import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register


class ActorWorker(Worker):
    """The policy: log-probs of a batch, and one optimizer step on it."""

    def __init__(self) -> None:
        super().__init__()
        self.role = "actor"
        torch.manual_seed(self.rank)
        self.policy = torch.nn.Linear(16, 4)
        self.optimizer = torch.optim.SGD(self.policy.parameters(), lr=0.1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def compute_log_prob(self, batch: int) -> float:
        with torch.no_grad():
            return float(torch.log_softmax(self.policy(torch.randn(batch, 16)), -1).mean())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_actor(self, batch: int) -> dict[str, float]:
        loss = -torch.log_softmax(self.policy(torch.randn(batch, 16)), -1)[:, 0].mean()
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0))
        self.optimizer.step()
        time.sleep(0.02)  # a visible phase in the Gantt
        return {"actor/pg_loss": float(loss.detach()), "actor/grad_norm": grad_norm}


class RefWorker(Worker):
    """The frozen reference policy: log-probs only."""

    def __init__(self) -> None:
        super().__init__()
        self.role = "ref"
        torch.manual_seed(0)
        self.policy = torch.nn.Linear(16, 4)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def compute_ref_log_prob(self, batch: int) -> float:
        with torch.no_grad():
            return float(torch.log_softmax(self.policy(torch.randn(batch, 16)), -1).mean())
