"""How many samples (and tokens) a batch holds, whatever its shape: a tensor, a tuple, a dict of tensors."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

_TOKEN_KEYS = ("input_ids", "tokens", "input_tokens")


def count_samples(batch: Any, default: int = 1) -> int:
    """The leading dimension of the first tensor in a batch (``default`` when it holds none)."""
    # the common (inputs, targets) case without pytree, at every micro-batch: a tuple of types (a union would be
    # made at each call) and the shape read once (a torch.Size is a tuple: no more tensor calls)
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch  # noqa: UP038
    if isinstance(first, torch.Tensor):
        shape = first.shape
        if shape:
            return int(shape[0])
    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return default


def count_tokens(batch: Any) -> int | None:
    """Tokens in a batch of token ids: the size of its ``input_ids`` (or ``tokens``) tensor where it is a dict,
    else of its first integer tensor with a sequence dimension (batch x length); ``None`` where it holds none
    (images, features: only samples are counted)."""
    if isinstance(batch, dict):
        for key in _TOKEN_KEYS:
            value = batch.get(key)
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and not value.is_floating_point():
                return int(value.numel())
    first = batch[0] if isinstance(batch, tuple | list) and batch else batch
    if isinstance(first, torch.Tensor):  # (inputs, targets): the inputs say what the batch is
        leaves = [first]
    else:
        leaves = tree_leaves(batch)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2 and not leaf.is_floating_point() \
                and not leaf.is_complex() and leaf.dtype != torch.bool:
            return int(leaf.numel())
    return None
