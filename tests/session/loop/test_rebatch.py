"""Re-cutting a step's loader batches into micro-batches."""

from __future__ import annotations

import pytest
import torch

from dtpo.core.errors import ConfigError
from dtpo.session.loop.rebatch import RecutBatches, cut_batch, join_batches


def test_join_then_cut_keeps_the_samples_in_order() -> None:
    a = (torch.arange(4), torch.arange(4) * 10)
    b = (torch.arange(4, 8), torch.arange(4, 8) * 10)
    parts = cut_batch(join_batches([a, b]), 4)
    assert [p[0].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [p[1].tolist() for p in parts] == [[0, 10], [20, 30], [40, 50], [60, 70]]


def test_a_step_that_cannot_be_cut_evenly_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot be cut into 3"):
        cut_batch(torch.arange(4), 3)


def test_recut_batches_draws_a_steps_loader_batches_once_and_hands_out_its_pieces() -> None:
    drawn: list[int] = []

    def loader():
        for i in range(4):
            drawn.append(i)
            yield torch.arange(i * 3, i * 3 + 3)

    iterator = iter(loader())
    recut = RecutBatches()
    first = recut.next(iterator, loader_batches=2, micro_batches=3)
    assert drawn == [0, 1] and first.tolist() == [0, 1]
    assert [recut.next(iterator, 2, 3).tolist() for _ in range(2)] == [[2, 3], [4, 5]]
    assert drawn == [0, 1]  # the step's pieces came from the batches already drawn
    assert recut.next(iterator, 2, 3).tolist() == [6, 7]  # the next step draws anew
    assert drawn == [0, 1, 2, 3]
