"""Uneven per-rank batches with the same update: each rank trains on its share of the step's global batch.

Under ``--tune rebalance`` the loader hands every rank the same global step batch (``dtpo train`` draws it from
one stream, the same on every rank), and :class:`BatchShares` cuts out this rank's consecutive share along the
first dimension: rank ``r`` takes the samples after those of ranks ``0 .. r-1``. So the ranks together still
train on exactly the global batch of the even run, whatever the shares.

DDP averages the ranks' gradients (it divides their sum by the world size), so each rank's mean loss is
weighted by ``world * share / global_batch`` (:attr:`BatchShares.loss_weight`): the average over ranks is then
the mean loss over the global batch, and its gradient the even run's to float rounding. What still differs from
the even run: statistics computed per rank over its own batch (BatchNorm's batch statistics and running
averages, a per-rank loss normalisation such as a token count) see batches of other sizes.

A loader's last batch may be smaller than the global batch (``drop_last=False``): it is split in proportion to
the shares in force.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from dtpo.core.errors import ConfigError
from dtpo.tune.rebalance import even_shares


class BatchShares:
    """This rank's share of every step's global batch.

    Args:
        rank: This rank.
        world: Number of ranks.

    Attributes:
        shares: Samples per rank of the full global batch (``None`` until the first batch fixes its size).
        global_batch: The global batch's size, from the first batch.
    """

    def __init__(self, rank: int, world: int) -> None:
        self.rank = rank
        self.world = world
        self.shares: tuple[int, ...] | None = None
        self.global_batch: int | None = None
        self._current: tuple[int, ...] = ()  # the shares of the batch being trained (a short last batch's own)

    @property
    def loss_weight(self) -> float:
        """The factor on this rank's mean loss that makes DDP's average over ranks the global batch's mean."""
        if not self._current:
            return 1.0
        return self.world * self._current[self.rank] / sum(self._current)

    @property
    def share(self) -> int | None:
        """This rank's samples per step (``None`` before the first batch)."""
        return None if self.shares is None else self.shares[self.rank]

    def set(self, shares: Sequence[int]) -> None:
        """Use ``shares`` from the next batch on (between optimizer steps, the same on every rank).

        Raises:
            ValueError: They do not give every rank a sample, or do not add up to the global batch.
        """
        shares = tuple(int(s) for s in shares)
        if self.global_batch is None:  # restored from a checkpoint before the first batch
            self.global_batch = sum(shares)
        if len(shares) != self.world or min(shares) < 1 or sum(shares) != self.global_batch:
            raise ValueError(f"shares {list(shares)} must give each of {self.world} ranks at least one sample and "
                             f"add up to the global batch of {self.global_batch}")
        self.shares = shares

    def take(self, batch: Any) -> Any:
        """This rank's share of the global ``batch``.

        Raises:
            ConfigError: The batch cannot be cut along a first dimension, or holds fewer samples than ranks.
        """
        leaves, spec = tree_flatten(batch)
        if not leaves or not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in leaves):
            kinds = ", ".join(sorted({type(t).__name__ for t in leaves})) or "an empty batch"
            raise ConfigError("--tune rebalance cuts each step's global batch into per-rank shares along the first "
                              f"dimension, so every part of a batch must be a tensor with one; this loader's batch "
                              f"holds {kinds}")
        size = int(leaves[0].shape[0])
        if any(int(t.shape[0]) != size for t in leaves):
            raise ConfigError("--tune rebalance cannot cut this loader's batches: their parts differ in the first "
                              f"dimension ({sorted({int(t.shape[0]) for t in leaves})})")
        if self.shares is None:
            if size < 2 * self.world:
                raise ConfigError(f"--tune rebalance needs a global batch of at least 2 samples per rank; the "
                                  f"loader's first batch holds {size} for {self.world} ranks")
            self.global_batch = size
            self.shares = even_shares(size, self.world)
        self._current = self.shares if size == self.global_batch else self._scaled(size)
        start = sum(self._current[:self.rank])
        stop = start + self._current[self.rank]
        return tree_unflatten([t[start:stop] for t in leaves], spec)

    def _scaled(self, size: int) -> tuple[int, ...]:
        """The shares of a batch of another size (a loader's short last batch), in proportion to those in force
        (largest remainders, ties to the lower rank)."""
        assert self.shares is not None and self.global_batch is not None
        if size < self.world:
            raise ConfigError(f"--tune rebalance: a batch of {size} samples cannot give each of {self.world} ranks "
                              "one (drop the loader's short last batch: drop_last=True)")
        exact = [size * s / self.global_batch for s in self.shares]
        out = [max(1, int(e)) for e in exact]
        order = sorted(range(self.world), key=lambda r: (out[r] - exact[r], r))
        i = 0
        while sum(out) < size:
            out[order[i % self.world]] += 1
            i += 1
        while sum(out) > size:
            r = max((r for r in range(self.world) if out[r] > 1), key=lambda r: (out[r] - exact[r], -r))
            out[r] -= 1
        return tuple(out)
