"""A small conv net classifying generated 3x32x32 images whose class shows as a noisy, shifted pattern.

Each class has a fixed smooth colour pattern; an image is its class's pattern, rolled by a random offset and
buried in Gaussian noise. The shift rewards translation-invariant features, so the task suits a conv net, and
the pattern makes the labels learnable, so the loss falls.

A share of the labels (``label_noise``, 10 % by default) is redrawn at random, as real data sets hold mislabelled
and ambiguous samples, so the loss falls towards a floor (:meth:`SyntheticCNN.loss_floor`, 0.50 nats by default)
rather than towards zero. Near zero, where the loss is set by how confident a model has grown, runs that
trained differently end up 20 to 60 % apart while every one of them has learnt the task; near the floor their
losses compare what they learnt.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dtpo.workloads.base import Batch, Workload, check_batch_args, rank_seed

PATTERN_SEED = 20_240_602  # fixed so every rank and every run learns the same classes
IMAGE_SHAPE = (3, 32, 32)


def class_patterns(num_classes: int, coarse: int = 4) -> torch.Tensor:
    """One smooth unit-variance pattern per class, ``[num_classes, 3, 32, 32]``.

    Args:
        num_classes: Number of classes.
        coarse: Side of the random grid each pattern is upsampled from; smaller means smoother.
    """
    gen = torch.Generator().manual_seed(PATTERN_SEED)
    grid = torch.randn(num_classes, IMAGE_SHAPE[0], coarse, coarse, generator=gen)
    # Periodic upsampling so a circular shift of a pattern is still smooth across the image's edges.
    tiled = grid.repeat(1, 1, 3, 3)
    up = F.interpolate(tiled, scale_factor=IMAGE_SHAPE[1] // coarse, mode="bicubic", align_corners=False)
    side = IMAGE_SHAPE[1]
    patterns = up[:, :, side:2 * side, side:2 * side]
    return patterns / patterns.std(dim=(1, 2, 3), keepdim=True)


class SmallConvNet(nn.Module):
    """Three ``conv -> ReLU -> pool`` stages, global average pooling and a linear head.

    Args:
        num_classes: Number of output logits.
        width: Channels of the first stage; later stages double it.
    """

    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        # No BatchNorm: its running statistics differ per rank and would need syncing under DDP.
        self.features = nn.Sequential(
            nn.Conv2d(IMAGE_SHAPE[0], width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, num_classes]`` for images ``[B, 3, 32, 32]``."""
        return self.head(self.features(x).flatten(1))


class SyntheticCNN(Workload):
    """:class:`SmallConvNet` on generated images of noisy, randomly shifted class patterns.

    Args:
        num_classes: Number of classes.
        noise: Standard deviation of the Gaussian noise added to the unit-variance pattern.
        label_noise: Share of the samples whose label is redrawn uniformly at random (the image keeps its class's
            pattern).
    """

    name: ClassVar[str] = "cnn"
    description: ClassVar[str] = "small conv net on generated 3x32x32 images of noisy, shifted class patterns"
    default_steps: ClassVar[int] = 1000
    default_batch_size: ClassVar[int] = 64
    default_lr: ClassVar[float] = 1e-3

    def __init__(self, num_classes: int = 10, noise: float = 4.0, label_noise: float = 0.1) -> None:
        if not 0.0 <= label_noise <= 1.0:
            raise ValueError(f"label_noise must be within [0, 1], got {label_noise}")
        self.num_classes = num_classes
        self.noise = noise
        self.label_noise = label_noise
        self.patterns = class_patterns(num_classes)

    def loss_floor(self) -> float:
        """The least mean cross entropy any model can reach (nats): the entropy of the labels given the image's
        class, with ``1 - label_noise + label_noise / num_classes`` on the true class."""
        other = self.label_noise / self.num_classes
        probabilities = [1.0 - self.label_noise + other] + [other] * (self.num_classes - 1)
        return -sum(p * math.log(p) for p in probabilities if p > 0)

    def build_model(self) -> nn.Module:
        """A freshly initialised :class:`SmallConvNet`."""
        return SmallConvNet(self.num_classes)

    def batches(self, batch_size: int, rank: int, world_size: int, seed: int = 0) -> Iterator[Batch]:
        """Images ``[B, 3, 32, 32]`` (float32) with uniformly drawn int64 labels ``[B]``, ``label_noise`` of them
        redrawn.

        Raises:
            ConfigError: ``batch_size`` is below 1 or ``rank`` is outside ``[0, world_size)``.
        """
        check_batch_args(batch_size, rank, world_size)
        generator = torch.Generator().manual_seed(rank_seed(seed, rank))
        side = IMAGE_SHAPE[1]
        rows = torch.arange(side)
        channels = torch.arange(IMAGE_SHAPE[0]).view(1, -1, 1, 1)

        def endless() -> Iterator[Batch]:
            while True:
                labels = torch.randint(0, self.num_classes, (batch_size,), generator=generator)
                dy, dx = torch.randint(0, side, (2, batch_size, 1, 1, 1), generator=generator)
                # A per-image circular shift, done as one gather rather than a Python loop of torch.roll.
                ys = (rows.view(1, 1, side, 1) - dy) % side
                xs = (rows.view(1, 1, 1, side) - dx) % side
                images = self.patterns[labels.view(-1, 1, 1, 1), channels, ys, xs]
                images = images + self.noise * torch.randn(batch_size, *IMAGE_SHAPE, generator=generator)
                redrawn = torch.rand(batch_size, generator=generator) < self.label_noise
                random_labels = torch.randint(0, self.num_classes, (batch_size,), generator=generator)
                yield images, torch.where(redrawn, random_labels, labels)

        return endless()

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross entropy of the logits against the labels."""
        return F.cross_entropy(output, target)
