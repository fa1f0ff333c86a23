"""Per-rank slowdown on two gloo ranks: the rank that only waits locks its clock, the straggler runs free,
both are restored at the end; one all-gather per window carries it all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_ranks, train_behind_a_straggler
from fakes import FakeGpu

import dtpo
from dtpo.session.tuning.stragglers import StragglerCallback

pytestmark = pytest.mark.slow

STEPS, WINDOW, LAG_S = 42, 10, 0.03


def _train(rank: int, world_size: int, out: str, with_knobs: list[int]) -> None:
    os.environ["DTPO_STATE_DIR"] = str(Path(out) / f"state{rank}")
    gpu = FakeGpu(f"gpu{rank}")
    callback = StragglerCallback("apply", [gpu] if rank in with_knobs else [])
    session = dtpo.Session(warmup_steps=2, window_steps=WINDOW, count_flops=False, progress=False, energy=False,
                           run_dir=Path(out) / "run", callbacks=[callback])
    train_behind_a_straggler(session, rank, STEPS, LAG_S)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "calls": gpu.calls, "locked_at_end": gpu.state.locked_sm_clocks_mhz, "gathers": callback.gathers,
        "windows": len(callback.history), "slack": session.lifecycle.rank.slack.to_dict()}))


def _results(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_the_waiting_rank_slows_down_and_everything_is_restored(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), [0, 1])
    fast, straggler = _results(tmp_path)
    assert any(call.startswith("lock ") for call in fast["calls"])  # the waiting rank locked its clock ...
    assert fast["calls"][-1] == "unlock" and fast["locked_at_end"] is None  # ... and got it back at the end
    assert not any(call.startswith("lock ") for call in straggler["calls"])  # the pace setter runs free
    assert fast["slack"]["tuned"] and fast["slack"]["clock_changes"]
    for result in (fast, straggler):
        assert result["gathers"] == result["windows"] == (STEPS - 2) // WINDOW  # one all-gather per window


def test_a_rank_without_clocks_keeps_every_rank_at_full_speed(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), [0])
    for result in _results(tmp_path):
        assert result["calls"] == []
        assert result["slack"]["tuned"] is False
