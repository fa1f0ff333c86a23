"""The per-step breakdown accounts for the step, and a straggler shows up as the other rank's sync wait."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_ranks
from torch import nn

import dtpo
from dtpo.core.record import RunRecord
from dtpo.core.totals import BREAKDOWN_PARTS, measured_steps


class SlowOnRank(nn.Module):
    """A model whose forward sleeps on one rank: a straggler."""

    def __init__(self, slow_rank: int, rank: int, delay_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
        self.delay_s = delay_s if rank == slow_rank else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.net(x)


def _train(rank: int, world_size: int, delay_s: float, out: str) -> None:
    session = dtpo.Session(warmup_steps=2, progress=False, run_dir=out)
    torch.manual_seed(0)
    model = session.wrap(SlowOnRank(slow_rank=1, rank=rank, delay_s=delay_s))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)

    def data():
        while True:
            x = torch.randn(64, 64, generator=gen)
            yield x, torch.randint(0, 8, (64,), generator=gen)

    start = time.perf_counter()
    for x, y in session.batches(data(), steps=12):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    loop_s = time.perf_counter() - start
    (Path(out) / f"loop_rank{rank}.json").write_text(json.dumps({"loop_s": loop_s}))
    session.finish()


@pytest.mark.slow
def test_parts_sum_to_the_step_and_steps_to_the_loop(tmp_path: Path) -> None:
    run_ranks(_train, 2, 0.0, str(tmp_path))
    record = RunRecord.load(tmp_path)
    assert record.status == "completed" and len(record.ranks) == 2
    for rank in record.ranks:
        assert len(rank.steps) == 12 and sum(s.warmup for s in rank.steps) == 2
        for step in rank.steps:
            parts = sum(getattr(step, p) for p in BREAKDOWN_PARTS)
            # The marks partition the step: only the few microseconds between marks are unaccounted for.
            assert abs(parts - step.step_s) <= 0.05 * step.step_s + 0.002, step
            assert all(getattr(step, p) >= 0 for p in BREAKDOWN_PARTS)
            assert step.samples == 64
        # Independently of the session's clock: the steps lie inside the loop the script timed itself and
        # cover most of it (what is left is the Session's own between-step work: callbacks, the partial
        # record's fsync, which the steps rightly do not include).
        loop_s = json.loads((tmp_path / f"loop_rank{rank.rank}.json").read_text())["loop_s"]
        covered = sum(s.step_s for s in rank.steps)
        assert 0.5 * loop_s <= covered <= loop_s, (covered, loop_s)
    totals = record.totals
    assert totals["measured_steps"]["value"] == 10
    assert totals["throughput"]["value"] > 0
    assert 0 < totals["mfu"]["value"] < 1


@pytest.mark.slow
def test_a_straggler_shows_up_as_the_other_ranks_sync_wait(tmp_path: Path) -> None:
    delay = 0.2  # far above the model's own compute, so the comparison holds on a busy machine
    run_ranks(_train, 2, delay, str(tmp_path))
    record = RunRecord.load(tmp_path)
    fast, slow = record.ranks
    fast_wait = statistics.median(s.sync_wait_s for s in measured_steps(fast))
    slow_wait = statistics.median(s.sync_wait_s for s in measured_steps(slow))
    assert fast_wait >= 0.5 * delay, fast_wait
    assert slow_wait < fast_wait / 4, (slow_wait, fast_wait)
    assert statistics.median(s.compute_s for s in measured_steps(slow)) >= delay
