"""Re-cutting micro-batches: gradient accumulation at a fixed global batch.

A loader yields micro-batches of the size the job was configured with, ``k`` of them per optimizer step. To
take ``k'`` micro-batches per step without changing what an update sees, the Session joins the step's ``k``
loader batches and cuts them into ``k'`` equal micro-batches: the same samples, in the same order, make each
update, and since every micro-batch has the same size the mean of the micro-batch losses (each scaled by
``1/k'``) is the mean over the step's samples, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from dtpo.core.errors import ConfigError


def _leaves(batch: Any) -> tuple[list[Any], Any]:
    leaves, spec = tree_flatten(batch)
    if not leaves or not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in leaves):
        raise ConfigError("accumulation at a fixed global batch re-cuts batches along their first dimension, so "
                          "every part of a batch must be a tensor with one (got "
                          f"{', '.join(sorted({type(t).__name__ for t in leaves})) or 'an empty batch'})")
    return leaves, spec


def join_batches(batches: list[Any]) -> Any:
    """The batches concatenated part by part along the first dimension (they must share one structure)."""
    if len(batches) == 1:
        return batches[0]
    flat = [_leaves(b) for b in batches]
    spec = flat[0][1]
    if any(s != spec for _, s in flat):
        raise ConfigError("the loader's batches differ in structure, so they cannot be joined into one step")
    return tree_unflatten([torch.cat(parts) for parts in zip(*(leaves for leaves, _ in flat), strict=True)], spec)


def cut_batch(batch: Any, parts: int) -> list[Any]:
    """``batch`` cut into ``parts`` micro-batches of equal size along the first dimension.

    Raises:
        ConfigError: The batch's size is not a multiple of ``parts``, or its parts disagree on it.
    """
    if parts == 1:
        return [batch]
    leaves, spec = _leaves(batch)
    size = int(leaves[0].shape[0])
    if any(int(t.shape[0]) != size for t in leaves):
        raise ConfigError("the parts of a batch differ in their first dimension, so it cannot be cut into "
                          "micro-batches")
    if size % parts:
        raise ConfigError(f"a step of {size} samples cannot be cut into {parts} equal micro-batches")
    pieces = [torch.tensor_split(t, parts) for t in leaves]
    return [tree_unflatten([p[i] for p in pieces], spec) for i in range(parts)]


class RecutBatches:
    """Hands out a step's micro-batches re-cut from its loader batches, one at a time: the step's first call draws
    its loader batches and cuts them, the others take the next piece."""

    def __init__(self) -> None:
        self._cut: list[Any] = []  # micro-batches cut from this step's loader batches, not yet handed out

    def next(self, iterator: Iterator[Any], loader_batches: int, micro_batches: int) -> Any:
        """The next micro-batch of ``micro_batches`` cut from ``loader_batches`` batches of ``iterator``."""
        if not self._cut:
            self._cut = cut_batch(join_batches([next(iterator) for _ in range(loader_batches)]), micro_batches)
        return self._cut.pop(0)
