"""Classification of Gaussian vectors labelled by a fixed random "teacher" network.

Like Horovod's synthetic benchmark it needs no data set, but its labels follow a rule, so the loss falls and a
run shows the model learning rather than only moving numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dtpo.workloads.base import Batch, Workload, check_batch_args, rank_seed

TEACHER_SEED = 20_240_601  # fixed so every rank and every run learns the same task


class Teacher:
    """A frozen random one-hidden-layer tanh network whose argmax is the label.

    A nonlinear teacher keeps the task from being solved by a single linear layer in a few steps.

    Args:
        in_features: Width of the input vectors.
        num_classes: Number of labels.
        hidden: Width of the teacher's hidden layer.
    """

    def __init__(self, in_features: int, num_classes: int, hidden: int = 64) -> None:
        gen = torch.Generator().manual_seed(TEACHER_SEED)
        # Scaled so pre-activations are O(1): tanh neither saturates nor stays linear.
        self.w1 = torch.randn(in_features, hidden, generator=gen) / in_features**0.5
        self.w2 = torch.randn(hidden, num_classes, generator=gen) / hidden**0.5

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Labels ``[B]`` (int64) for inputs ``x`` of shape ``[B, in_features]``."""
        return (torch.tanh(x @ self.w1) @ self.w2).argmax(dim=1)


class SyntheticMLP(Workload):
    """A few-layer MLP student learning a random teacher's labels on generated Gaussian inputs.

    Args:
        in_features: Width of the input vectors.
        hidden: Width of each of the student's hidden layers.
        depth: Number of hidden layers.
        num_classes: Number of labels.
    """

    name: ClassVar[str] = "mlp"
    description: ClassVar[str] = "MLP learning a random teacher's labels on generated Gaussian vectors"
    default_steps: ClassVar[int] = 1800
    default_batch_size: ClassVar[int] = 128
    default_lr: ClassVar[float] = 1e-3

    def __init__(self, in_features: int = 256, hidden: int = 1024, depth: int = 3,
                 num_classes: int = 10) -> None:
        self.in_features = in_features
        self.hidden = hidden
        self.depth = depth
        self.num_classes = num_classes
        self.teacher = Teacher(in_features, num_classes)

    def build_model(self) -> nn.Module:
        """A freshly initialised ``Linear -> ReLU`` stack ending in a ``num_classes``-way linear head."""
        layers: list[nn.Module] = []
        width = self.in_features
        for _ in range(self.depth):
            layers += [nn.Linear(width, self.hidden), nn.ReLU()]
            width = self.hidden
        layers.append(nn.Linear(width, self.num_classes))
        return nn.Sequential(*layers)

    def batches(self, batch_size: int, rank: int, world_size: int, seed: int = 0) -> Iterator[Batch]:
        """Fresh standard-normal inputs ``[B, in_features]`` with the teacher's int64 labels ``[B]``.

        Raises:
            ConfigError: ``batch_size`` is below 1 or ``rank`` is outside ``[0, world_size)``.
        """
        check_batch_args(batch_size, rank, world_size)
        generator = torch.Generator().manual_seed(rank_seed(seed, rank))

        def endless() -> Iterator[Batch]:
            while True:
                x = torch.randn(batch_size, self.in_features, generator=generator)
                yield x, self.teacher(x)

        return endless()

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross entropy of the logits against the teacher's labels."""
        return F.cross_entropy(output, target)
