"""The agent's decisions across ranks go over a group of its own, never the script's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import run_ranks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dtpo.agent.channel import agent_context
from dtpo.agent.run import AgentRun
from dtpo.agent.torch_hooks import TorchHooks
from dtpo.agent.tracker import StepTracker
from dtpo.core.config import RunConfig
from dtpo.core.record import RunRecord

COLLECTIVES = ("all_reduce", "all_gather", "broadcast_object_list", "gather_object", "barrier", "broadcast")


def _ddp_script_rank(rank: int, world_size: int, run_dir: str) -> None:
    """A plain DDP loop on its own gloo group, with the agent's hooks as a worker has them; every collective
    called through ``torch.distributed`` is written down with its group."""
    os.environ["DTPO_RUN_DIR"] = run_dir
    dist.init_process_group("gloo")
    calls: list[tuple[str, Any]] = []
    saved = {name: getattr(dist, name) for name in COLLECTIVES}

    def spy(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, kwargs.get("group")))
            return saved[name](*args, **kwargs)
        return call

    for name in COLLECTIVES:
        setattr(dist, name, spy(name))
    config = RunConfig().replace(tune={"knob": "stragglers"}, energy={"enabled": False},
                                 session={"window_steps": 4})
    runs: list[AgentRun] = []

    def open_run(tracker: StepTracker) -> AgentRun:
        runs.append(AgentRun(agent_context(torch.device("cpu")), config.replace(session={"strategy": "ddp"}),
                             "ddp.py"))
        return runs[-1]

    hooks = TorchHooks(StepTracker(open_run))
    hooks.install()
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                                            torch.nn.Linear(32, 2)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
        for x, y in DataLoader(data, batch_size=8, sampler=DistributedSampler(data)):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        (run,) = runs
        group = run.ctx.group
        assert group is not None and group is not dist.group.WORLD
        dist.destroy_process_group()  # the script's end: the ranks gather their records first
    finally:
        hooks.remove()
        for name, function in saved.items():
            setattr(dist, name, function)
    assert run.lifecycle.finished
    assert {"all_gather", "gather_object", "barrier"} <= {name for name, _ in calls}
    assert all(g is group for _, g in calls), [(name, g) for name, g in calls if g is not group]


@pytest.mark.slow
def test_the_agent_never_adds_a_collective_to_the_scripts_group_and_gathers_at_its_end(tmp_path: Path) -> None:
    run_ranks(_ddp_script_rank, 2, str(tmp_path / "run"))
    record = RunRecord.load(tmp_path / "run")  # written by rank 0, every rank's steps gathered to it
    assert record.status == "completed" and [r.rank for r in record.ranks] == [0, 1]
    for rank in record.ranks:
        assert len(rank.steps) == 16 and sum(s.samples for s in rank.steps) == 128
        assert rank.slack is not None  # the ranks' ready times were gathered over the agent's group
