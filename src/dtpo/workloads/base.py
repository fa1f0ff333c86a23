"""The interface every built-in example workload implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from dtpo.core.errors import ConfigError

Batch = tuple[torch.Tensor, torch.Tensor]

EVALUATION_SEED = 2**40 + 2_024  # the evaluation set's own seed, far from any training seed a user types
EVALUATION_SAMPLES = 1024


class Workload(ABC):
    """A model, an endless stream of batches, and a loss: enough for ``dtpo train`` to run it.

    Subclasses set :attr:`name`, :attr:`description`, :attr:`default_steps`, :attr:`default_batch_size` and
    :attr:`default_lr` (for AdamW).
    Everything is generated or read from files that ship with Python: no network.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    default_steps: ClassVar[int]
    default_batch_size: ClassVar[int]
    default_lr: ClassVar[float]

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

    def evaluation_batches(self) -> list[Batch]:
        """The evaluation set: the same :data:`EVALUATION_SAMPLES` samples in every run, whatever its seed, batch
        size and worker count (drawn from the workload's own generator with a seed of its own,
        :data:`EVALUATION_SEED`, in batches of :attr:`default_batch_size`). Runs that trained differently are
        compared on it without the noise of the batches each happened to see last."""
        data = self.batches(self.default_batch_size, 0, 1, seed=EVALUATION_SEED)
        batches: list[Batch] = []
        drawn = 0
        while drawn < EVALUATION_SAMPLES:
            batch = next(data)
            batches.append(batch)
            drawn += self.samples_in(batch)
        return batches


def rank_seed(seed: int, rank: int) -> int:
    """A well-mixed 63-bit generator seed for ``(seed, rank)``, distinct per rank, stable across runs.

    Raises:
        ConfigError: ``seed`` is negative.
    """
    if seed < 0:
        raise ConfigError(f"seed must be non-negative, got {seed}")
    return int(np.random.SeedSequence((seed, rank)).generate_state(1, dtype=np.uint64)[0] >> 1)


def check_batch_args(batch_size: int, rank: int, world_size: int) -> None:
    """Validate the arguments of :meth:`Workload.batches`.

    Called before the first batch is drawn so a bad flag fails at start-up, not mid-loop.

    Raises:
        ConfigError: ``batch_size`` is below 1 or ``rank`` is outside ``[0, world_size)``.
    """
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")
