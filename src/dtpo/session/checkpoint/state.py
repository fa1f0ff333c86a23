"""What a checkpoint is made of, apart from driving it (:mod:`dtpo.session.checkpoint`): the model and its
optimizers as a DCP ``Stateful``, a rank's own state as another (one opaque item), the position in the data, the
random generators' states, and the fingerprint that tells whether a checkpoint belongs to a model."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Iterable, Iterator
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

from dtpo.core.errors import ConfigError

__all__ = ["DataPosition", "Opaque", "RankState", "TrainState", "model_fingerprint", "rng_state", "set_rng_state"]


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


class RankState(Stateful):
    """One rank's own state as DCP saves it: one opaque item under the rank's key (``rankN``), so no rank reads
    another's and its shape need not be known before loading.

    Args:
        value: What to save (``None`` when loading: :attr:`value` is what was loaded).
    """

    def __init__(self, value: dict[str, Any] | None = None) -> None:
        self.value = value

    def state_dict(self) -> Any:  # one leaf, not a dict: DCP pickles it whole
        """The value wrapped as one item."""
        return Opaque(self.value)

    def load_state_dict(self, state_dict: Any) -> None:
        """Take the loaded item."""
        self.value = state_dict.value if isinstance(state_dict, Opaque) else state_dict


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


def _stateful_data(iterable: Any) -> bool:
    return callable(getattr(iterable, "state_dict", None)) and callable(getattr(iterable, "load_state_dict", None))


class _Counted:
    """An iterator that counts the items taken from it."""

    def __init__(self, iterator: Iterator[Any], owner: DataPosition) -> None:
        self._iterator = iterator
        self._owner = owner

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._iterator)
        self._owner.consumed += 1
        return item


class DataPosition:
    """Where ``Session.batches`` stands in its iterable: the loader batches the current call took, or the
    iterable's own ``state_dict`` where it has one (as torchdata's ``StatefulDataLoader`` does). After
    :meth:`load_state_dict`, the next :meth:`iterate` moves the iterable there (through its ``load_state_dict``,
    or by replaying that many batches).
    """

    def __init__(self) -> None:
        self.consumed = 0
        self._iterable: Any = None
        self._seek: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """``{"batches": consumed, "state": the iterable's own state or None}``; a loaded position not yet moved
        to is returned as loaded."""
        if self._seek is not None:
            return dict(self._seek)
        iterable = self._iterable
        return {"batches": self.consumed,
                "state": iterable.state_dict() if iterable is not None and _stateful_data(iterable) else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The position the next :meth:`iterate` moves its iterable to."""
        self._seek = {"batches": int(state["batches"]), "state": state.get("state")}

    def iterate(self, iterable: Iterable[Any], before: str = "the checkpoint") -> Iterator[Any]:
        """A counted iterator over ``iterable``, moved to the loaded position if one waits.

        Args:
            iterable: What ``Session.batches`` draws from.
            before: Where the position was taken, for the error when replaying runs out of data.

        Raises:
            ConfigError: The data ended before the position was reached.
        """
        seek, self._seek = self._seek, None
        self.consumed = 0
        if seek is not None and seek["state"] is not None and _stateful_data(iterable):
            iterable.load_state_dict(seek["state"])  # type: ignore[attr-defined]
            iterator = iter(iterable)
            self.consumed = seek["batches"]
        elif seek is not None:
            iterator = iter(iterable)
            for index in range(seek["batches"]):
                try:
                    next(iterator)
                except StopIteration:
                    raise ConfigError(f"the data ended after {index} batches while replaying the "
                                      f"{seek['batches']} batches before {before}") from None
            self.consumed = seek["batches"]
        else:
            iterator = iter(iterable)
        self._iterable = iterable
        return _Counted(iterator, self)
