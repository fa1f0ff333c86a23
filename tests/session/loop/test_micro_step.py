"""The micro-step contexts: nothing to open with one micro-step per step, and FLOPs counted when asked."""

from __future__ import annotations

import torch
from torch import nn

from dtpo.session.loop.micro_step import MicroStepContexts


def test_one_micro_step_per_step_without_counting_opens_nothing() -> None:
    contexts = MicroStepContexts(distributed=False, strategy="ddp")
    contexts.enter(nn.Linear(4, 2), accum=1, last=True, count_flops=False)
    assert not contexts.open and contexts.flops == 0


def test_flops_are_counted_between_enter_and_exit_and_add_up() -> None:
    model = nn.Linear(4, 2)
    contexts = MicroStepContexts(distributed=False, strategy="ddp")
    for micro in range(2):
        contexts.enter(model, accum=2, last=micro == 1, count_flops=True)
        assert contexts.open
        model(torch.randn(8, 4)).sum().backward()
        contexts.exit()
        assert not contexts.open
    # per micro-step: the forward matmul, 2*8*4*2, and one as large in backward (the weight's gradient; the input
    # needs none)
    assert contexts.flops == 2 * (2 * 8 * 4 * 2) * 2
