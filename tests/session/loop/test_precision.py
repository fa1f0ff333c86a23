"""A precision applied to a model's forward."""

from __future__ import annotations

import torch
from torch import nn

from dtpo.session.loop.precision import Precision, cast_forward


def test_cast_forward_follows_the_current_precision_at_each_call() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2))
    current = {"p": Precision("32-true", torch.device("cpu"))}
    cast_forward(model, lambda: current["p"])
    x = torch.randn(3, 4)
    plain = model(x)
    assert plain.dtype == torch.float32
    assert torch.equal(plain, nn.functional.linear(x, model[0].weight, model[0].bias))

    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    current["p"] = Precision("bf16-mixed", torch.device("cpu"))
    cast = model(x)
    assert seen == [torch.bfloat16]  # computed under autocast ...
    assert cast.dtype == torch.float32  # ... and handed back in float32
