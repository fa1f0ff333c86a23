"""Numeric precision: autocast for the forward pass and a gradient scaler for float16."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from dtpo.core.config import PRECISIONS
from dtpo.core.errors import ConfigError

_AUTOCAST_DTYPE = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def check_precision(name: str, device: torch.device | str) -> None:
    """Raise :class:`ConfigError` (one line) unless ``device`` can autocast to ``name``'s dtype.

    CUDA GPUs before Ampere have no bfloat16 arithmetic (torch reports it through
    ``torch.cuda.is_bf16_supported``); a device type torch has no autocast for cannot run a mixed precision.
    """
    if name not in PRECISIONS:
        raise ConfigError(f"unknown precision {name!r} (choose from: {', '.join(PRECISIONS)})")
    kind = torch.device(device).type
    dtype = _AUTOCAST_DTYPE.get(name)
    if dtype is None:
        return
    if not torch.amp.is_autocast_available(kind):
        raise ConfigError(f"precision {name} needs autocast, which torch does not have for {kind} devices")
    if kind == "cuda" and dtype == torch.bfloat16 and torch.cuda.is_available() \
            and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise ConfigError(f"precision {name}: {torch.cuda.get_device_name()} has no bfloat16 arithmetic "
                          "(Ampere or newer); use 16-mixed")


class Precision:
    """One of :data:`PRECISIONS` applied on one device.

    Args:
        name: The precision's name.
        device: The device the model runs on.
    """

    def __init__(self, name: str, device: torch.device) -> None:
        check_precision(name, device)
        self.name = name
        self.device = device
        self.autocast_dtype = _AUTOCAST_DTYPE.get(name)
        # float16's narrow range underflows small gradients; bfloat16 has float32's range and needs no scaler.
        self.scaler = torch.amp.GradScaler(device.type) if name == "16-mixed" else None

    @property
    def changes_numerics(self) -> bool:
        """Whether training in this precision computes different numbers than ``32-true``."""
        return self.autocast_dtype is not None

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype matrix multiplications run in."""
        return self.autocast_dtype or torch.float32

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """Autocast around a forward pass (nothing for ``32-true``)."""
        if self.autocast_dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.autocast_dtype):
            yield

    def to_float32(self, output: Any) -> Any:
        """Cast floating tensors in a forward's output back to float32, so losses are computed in float32."""
        if self.autocast_dtype is None:
            return output
        return tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                        output)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward, through the gradient scaler when there is one."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale (before clipping)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``, skipped by the scaler when gradients overflowed."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()


def cast_forward(model: nn.Module, current: Callable[[], Precision]) -> None:
    """Run ``model``'s forward in the precision ``current()`` returns at each call (it may change between steps):
    under autocast, its floating outputs cast back to float32; as it is for ``32-true``."""
    inner_forward = model.forward

    def forward(self_: nn.Module, *args: Any, **kwargs: Any) -> Any:
        precision = current()
        if precision.autocast_dtype is None:
            return inner_forward(*args, **kwargs)
        with precision.forward_context():
            return precision.to_float32(inner_forward(*args, **kwargs))

    model.forward = types.MethodType(forward, model)  # type: ignore[method-assign]
