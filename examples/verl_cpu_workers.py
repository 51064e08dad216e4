"""Three of verl's worker roles, small enough for a CPU: what ``examples/verl_tracking.py`` runs.

They are verl ``Worker`` classes whose methods are offered to the trainer with verl's own
``@register``, as ``ActorRolloutRefWorker``'s and ``CriticWorker``'s are. Ray loads this module in
each worker process after ``rankscope.verl.register`` ran there, as it loads verl's workers.
"""

from __future__ import annotations

import os
import time

import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register


class ActorWorker(Worker):
    """The policy: log-probs of a batch, and one optimizer step on it."""

    def __init__(self) -> None:
        super().__init__()
        self.role = "actor"
        torch.manual_seed(int(os.environ.get("RANK", "0")))
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
        return {"actor/pg_loss": float(loss.detach()), "actor/grad_norm": grad_norm, "actor/lr": self.lr()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def lr(self) -> float:
        """A registered method the worker also calls itself: timed once, as the outer call."""
        return float(self.optimizer.param_groups[0]["lr"])


class RefWorker(Worker):
    """The frozen reference policy, colocated with the actor (verl's hybrid engine): log-probs only."""

    def __init__(self) -> None:
        super().__init__()
        self.role = "ref"
        torch.manual_seed(0)
        self.policy = torch.nn.Linear(16, 4)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def compute_ref_log_prob(self, batch: int) -> float:
        with torch.no_grad():
            return float(torch.log_softmax(self.policy(torch.randn(batch, 16)), -1).mean())


class CriticWorker(Worker):
    """The value model, in processes of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.value = torch.nn.Linear(16, 1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_critic(self, batch: int) -> dict[str, float]:
        loss = self.value(torch.randn(batch, 16)).pow(2).mean()
        loss.backward()
        return {"critic/vf_loss": float(loss.detach())}
