"""Online slack on two gloo ranks: the rank that only waits learns it, once per window, not per step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_ranks, train_behind_a_straggler

import dtpo
from dtpo.session.tuning.slack import SlackCallback

pytestmark = pytest.mark.slow

STEPS, WARMUP, WINDOW, LAG_S = 42, 2, 10, 0.03


def _train(rank: int, world_size: int, out: str) -> None:
    slack = SlackCallback()
    session = dtpo.Session(warmup_steps=WARMUP, window_steps=WINDOW, count_flops=False, progress=False,
                           energy=False, run_dir=Path(out) / "run", callbacks=[slack])
    train_behind_a_straggler(session, rank, STEPS, LAG_S)
    latest = slack.latest
    assert latest is not None
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "gathers": slack.gathers, "windows": len(slack.history), "critical": latest.critical_rank,
        "critical_share": latest.critical_share, "wait_s": list(latest.wait_s),
        "record": session.lifecycle.rank.slack.to_dict(), "trend": slack.trend_s(0)}))


def test_the_waiting_rank_learns_its_slack_once_per_window(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path))
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    full_windows = (STEPS - WARMUP) // WINDOW
    for result in results:
        # one all-gather per full window (the last, shorter one is not gathered): never one per step
        assert result["gathers"] == result["windows"] == full_windows
        assert result["critical"] == 1 and result["critical_share"] > 0.5
    # both ranks hold the same picture: rank 0 waits about the lag, rank 1 hardly at all
    assert results[0]["wait_s"] == results[1]["wait_s"]
    wait0, wait1 = results[0]["wait_s"]
    assert wait0 > 0.3 * LAG_S and wait1 < wait0 / 2
    record = results[0]["record"]
    assert record["windows"] == full_windows and record["critical_ranks"] == {"1": full_windows}
    assert record["wait_s_per_step"] > 0.3 * LAG_S and record["wait_share"] > 0.1


def test_a_window_summary_holds_each_rank_s_mean_over_its_odd_numbered_steps_for_the_policy() -> None:
    import torch

    from dtpo.core.steps import Window
    from dtpo.session.tuning.slack import _summarise

    ready = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 7.0, 9.0]], dtype=torch.float64)
    table = torch.zeros(2, 4, 6, dtype=torch.float64)
    table[:, :, 0] = ready
    table[:, :, 1] = float("nan")
    table[:, :, 2] = 10.0
    summary = _summarise(Window(0, 0, 3, 40.0, 4, 10.0), table)
    assert summary.ready_s == (2.5, 6.5)
    assert summary.holdout_s == (3.0, 7.0)  # steps 1 and 3 of each rank
