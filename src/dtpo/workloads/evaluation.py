"""The loss of a trained model on its workload's fixed evaluation set (:meth:`Workload.evaluation_batches`).

The set's batches are shared out over the ranks, each rank evaluates its share with the model in eval mode and
without gradients, and the sums are all-reduced, so every rank returns the mean over the whole set. Every rank
runs the same number of forward passes (a rank short of a batch repeats one and leaves it out of the sums), as
FSDP's all-gathers need. The forward runs in the precision the run trained in at the end, as the model's own
``forward`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from dtpo.workloads.base import Workload

__all__ = ["Evaluation", "evaluate"]


@dataclass(frozen=True)
class Evaluation:
    """A model's mean loss over its workload's evaluation set.

    Attributes:
        loss: Mean of the per-batch mean losses, weighted by samples.
        samples: Samples in the set.
    """

    loss: float
    samples: int

    def as_dict(self) -> dict[str, float | int]:
        """Plain values for the record."""
        return {"loss": self.loss, "samples": self.samples}


def evaluate(model: nn.Module, workload: Workload, device: torch.device, rank: int = 0,
             world_size: int = 1) -> Evaluation:
    """The mean loss of ``model`` over ``workload``'s evaluation set, shared out over ``world_size`` ranks (the
    default process group all-reduces the sums when it has more than one rank)."""
    batches = workload.evaluation_batches()
    rounds = math.ceil(len(batches) / world_size)
    totals = torch.zeros(2, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(rounds):
                index = rank + i * world_size
                inputs, targets = batches[index] if index < len(batches) else batches[0]
                loss = workload.loss(model(inputs.to(device)), targets.to(device))
                if index < len(batches):
                    samples = workload.samples_in((inputs, targets))
                    totals += torch.tensor([float(loss) * samples, samples], dtype=torch.float64)
    finally:
        model.train(was_training)
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        reduced = totals.to(device)
        dist.all_reduce(reduced)
        totals = reduced.cpu()
    loss_sum, samples = (float(x) for x in totals)
    return Evaluation(loss_sum / samples, int(samples))
