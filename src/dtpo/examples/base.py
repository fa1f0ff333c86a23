"""The interface every built-in example workload implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]


class Workload(ABC):
    """A model, an endless stream of batches, and a loss: enough for ``dtpo train`` to run it.

    Subclasses set :attr:`name`, :attr:`description`, :attr:`default_steps` and :attr:`default_batch_size`.
    Everything is generated or read from files that ship with Python: no network.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    default_steps: ClassVar[int]
    default_batch_size: ClassVar[int]

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model (call ``torch.manual_seed`` first for identical replicas)."""

    @abstractmethod
    def batches(self, batch_size: int, rank: int, world_size: int, seed: int = 0) -> Iterator[Batch]:
        """An endless iterator of ``(inputs, targets)`` for one rank; ranks see different data."""

    @abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean loss of one batch, from the model's output."""

    def samples_in(self, batch: Batch) -> int:
        """How many samples a batch holds (its leading dimension)."""
        return int(batch[0].shape[0])
