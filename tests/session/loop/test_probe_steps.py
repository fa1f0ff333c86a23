"""ProbeSteps alone: the kept batch comes back once per pass in the probe's setting, the gradient is taken and
the model left as it was."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dtpo.core.config import SessionConfig
from dtpo.core.errors import ConfigError
from dtpo.session.loop.probe import ProbeRequest, ProbeResult
from dtpo.session.loop.probe_steps import ProbeSteps
from dtpo.session.loop.switches import Switches


def _probes() -> ProbeSteps:
    return ProbeSteps(Switches(SessionConfig(), torch.device("cpu")))


def test_a_probe_takes_the_gradient_of_the_kept_batch_in_its_setting_and_updates_nothing() -> None:
    torch.manual_seed(0)
    probes = _probes()
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    batch = (torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 1, 0]))
    results: list[ProbeResult] = []
    probes.keep_next_batch()
    assert probes.keep_next
    probes.keep(batch)
    probes.request(ProbeRequest("bf16-mixed", "none", 1, passes=2, done=results.append))
    assert probes.pending
    weights = [p.detach().clone() for p in model.parameters()]
    seen = []
    for x, y in probes.run():
        seen.append(probes.switches.precision.name)
        with probes.switches.precision.forward_context():
            loss = F.cross_entropy(model(x).float(), y)
        assert probes.backward(loss)
        assert probes.step(opt, model)
    assert seen == ["bf16-mixed", "bf16-mixed"] and probes.switches.precision.name == "32-true"
    assert not probes.pending and len(results) == 1
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.cross_entropy(model(batch[0]).float(), batch[1]).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.allclose(results[0].gradient, expected) and results[0].finite


def test_outside_a_probe_pass_backward_and_step_are_left_to_training() -> None:
    probes = _probes()
    loss = nn.Linear(2, 1)(torch.ones(1, 2)).sum()
    assert not probes.backward(loss)
    assert not probes.step(torch.optim.SGD([torch.zeros(1, requires_grad=True)]), None)


def test_a_probe_needs_a_kept_batch_and_compression_needs_ddp() -> None:
    probes = _probes()
    with pytest.raises(ConfigError, match="needs DDP"):
        probes.request(ProbeRequest("32-true", "fp16", 1, passes=1, done=lambda _: None))
    probes.request(ProbeRequest("32-true", "none", 1, passes=1, done=lambda _: None))
    with pytest.raises(RuntimeError, match="kept batch"):
        next(probes.run())
