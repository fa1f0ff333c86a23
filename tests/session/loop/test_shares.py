"""A rank's share of the global batch: consecutive samples, a loss weight that keeps DDP's mean the global mean."""

from __future__ import annotations

import pytest
import torch

from dtpo.core.errors import ConfigError
from dtpo.session.loop.shares import BatchShares


def test_every_rank_takes_its_consecutive_share_and_together_they_hold_the_batch() -> None:
    x = torch.arange(16).reshape(16, 1)
    batch = {"x": x, "y": x.squeeze(1) * 10}
    parts = []
    for rank in range(3):
        shares = BatchShares(rank, 3)
        shares.set([2, 9, 5])
        parts.append(shares.take(batch))
    assert [len(p["x"]) for p in parts] == [2, 9, 5]
    assert torch.equal(torch.cat([p["x"] for p in parts]), x)
    assert torch.equal(parts[1]["y"], torch.arange(2, 11) * 10)


def test_the_first_batch_fixes_an_even_split() -> None:
    shares = BatchShares(1, 4)
    assert shares.loss_weight == 1.0 and shares.share is None
    part = shares.take(torch.zeros(10, 3))
    assert shares.shares == (3, 3, 2, 2) and len(part) == 3 and shares.share == 3


def test_the_loss_weights_average_to_the_global_mean() -> None:
    losses = torch.rand(16)
    weighted = []
    for rank in range(2):
        shares = BatchShares(rank, 2)
        shares.set([5, 11])
        mine = shares.take(losses)
        weighted.append(mine.mean() * shares.loss_weight)
    assert torch.stack(weighted).mean().item() == pytest.approx(losses.mean().item(), rel=1e-6)


def test_a_short_last_batch_is_split_in_proportion() -> None:
    sizes = []
    for rank in range(2):
        shares = BatchShares(rank, 2)
        shares.set([4, 12])
        sizes.append(len(shares.take(torch.zeros(8))))
    assert sizes == [2, 6]


def test_batches_that_cannot_be_cut_are_refused_in_one_line() -> None:
    shares = BatchShares(0, 2)
    with pytest.raises(ConfigError, match="must be a tensor with one.*str"):
        shares.take((torch.zeros(8, 2), ["a"] * 8))
    with pytest.raises(ConfigError, match="differ in the first dimension"):
        shares.take((torch.zeros(8, 2), torch.zeros(6)))
    with pytest.raises(ConfigError, match="at least 2 samples per rank"):
        shares.take(torch.zeros(3))


def test_shares_that_do_not_add_up_are_refused() -> None:
    shares = BatchShares(0, 2)
    shares.take(torch.zeros(8))
    with pytest.raises(ValueError):
        shares.set([4, 5])
    with pytest.raises(ValueError):
        shares.set([0, 8])
