"""The contexts around one micro-step's forward and backward: no gradient sync on all but the last micro-step of an
accumulation window (DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``), and FLOP counting
(``torch.utils.flop_counter``) on the first step, for MFU."""

from __future__ import annotations

import contextlib
from typing import Any

from torch.utils.flop_counter import FlopCounterMode


class MicroStepContexts:
    """Opens the micro-step's contexts as its batch is handed out and closes them after its backward.

    Args:
        distributed: Whether other ranks take part (gradient sync exists).
        strategy: ``"ddp"`` or ``"fsdp"``.

    Attributes:
        open: Whether contexts are open now (the backward closes them when it is).
        flops: FLOPs counted so far (the first step's micro-steps).
    """

    def __init__(self, distributed: bool, strategy: str) -> None:
        self.distributed = distributed
        self.strategy = strategy
        self.open = False
        self.flops = 0
        self._stack: contextlib.ExitStack | None = None
        self._counter: FlopCounterMode | None = None

    def enter(self, model: Any, accum: int, last: bool, count_flops: bool) -> None:
        """Open what this micro-step needs: nothing with one micro-step per step and no FLOP counting.

        Args:
            model: The wrapped model.
            accum: Micro-steps per optimizer step.
            last: This is the step's last micro-step (its gradients are synchronised).
            count_flops: Count this micro-step's FLOPs.
        """
        if accum == 1 and not count_flops:
            return
        stack = contextlib.ExitStack()
        if self.distributed and accum > 1:
            if self.strategy == "ddp" and not last:
                stack.enter_context(model.no_sync())
            elif self.strategy == "fsdp":
                model.set_requires_gradient_sync(last)
        if count_flops:
            self._counter = FlopCounterMode(display=False)
            stack.enter_context(self._counter)
        self._stack = stack
        self.open = True

    def exit(self) -> None:
        """Close them, adding the FLOPs counted."""
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        if self._counter is not None:
            self.flops += self._counter.get_total_flops()
            self._counter = None
        self.open = False
