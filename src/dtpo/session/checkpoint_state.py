"""What a checkpoint is made of, apart from driving it (:mod:`dtpo.session.checkpoint`): the model and its
optimizers as a DCP ``Stateful``, a rank's own state as one opaque item, the random generators' states, and the
fingerprint that tells whether a checkpoint belongs to a model."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

__all__ = ["Opaque", "TrainState", "model_fingerprint", "rng_state", "set_rng_state"]


def model_fingerprint(module: nn.Module) -> str:
    """A hash of a model's parameter and buffer names, shapes and dtypes (before DDP or FSDP wraps it)."""
    digest = hashlib.sha256()
    for kind, items in (("p", module.named_parameters()), ("b", module.named_buffers())):
        for name, tensor in items:
            digest.update(f"{kind}:{name}:{tuple(tensor.shape)}:{tensor.dtype}\n".encode())
    return digest.hexdigest()[:16]


@dataclasses.dataclass
class Opaque:
    """A value DCP stores as one pickled item instead of walking into it (a rank's own state)."""

    value: Any = None


class TrainState(Stateful):
    """The model and its optimizers as DCP saves them: ``get_state_dict`` on save, ``set_state_dict`` on load,
    so DDP's ``module.`` prefix is dropped and FSDP2's DTensors stay sharded.

    Args:
        model: The wrapped model (DDP, FSDP2 or plain).
        optimizers: Its optimizers (may be empty: the model alone).
    """

    def __init__(self, model: nn.Module, optimizers: tuple[torch.optim.Optimizer, ...]) -> None:
        self.model = model
        self.optimizers = optimizers

    def state_dict(self) -> dict[str, Any]:
        """The model's (and optimizers') state dict."""
        if not self.optimizers:
            return {"model": get_model_state_dict(self.model)}
        model_state, optim_state = get_state_dict(self.model, self.optimizers)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Put a loaded state dict into the model and optimizers."""
        if not self.optimizers:
            set_model_state_dict(self.model, state_dict["model"])
            return
        set_state_dict(self.model, self.optimizers, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


def rng_state() -> dict[str, Any]:
    """Every random generator training may draw from: torch CPU and CUDA, Python's, NumPy's."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                             "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
