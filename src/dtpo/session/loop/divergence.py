"""Stopping a run whose loss stopped being a number."""

from __future__ import annotations

import math
from collections.abc import Sequence

from dtpo.core.errors import DtpoError
from dtpo.core.record import StepRecord


class DivergedError(DtpoError):
    """The training loss became NaN or infinite: the run stops with ``status: "diverged"``."""

    exit_code = 1

    def __init__(self, step: int, loss: float, rank: int) -> None:
        super().__init__(f"loss became {loss} at step {step} on rank {rank}")
        self.step = step
        self.loss = loss
        self.rank = rank


def check_loss(loss: float | None, step: int, rank: int) -> None:
    """Raise :class:`DivergedError` when ``loss`` is NaN or infinite (``None``: the step had no loss)."""
    if loss is not None and not math.isfinite(loss):
        raise DivergedError(step, loss, rank)


def first_diverged(records: Sequence[StepRecord]) -> int | None:
    """The index of the first record whose loss :func:`check_loss` would refuse, ``None`` when none."""
    for i, record in enumerate(records):
        loss = record.loss
        if loss is not None and not math.isfinite(loss):
            return i
    return None
