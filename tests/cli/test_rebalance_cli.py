"""``dtpo simulate --tune rebalance[,stragglers]``: uneven per-rank batches against no tuning, the shares over the job,
the throughput against the ideal, ``--json``; bad requests are one line, exit 2, nothing left behind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli as run

REBALANCE = ["simulate", "--straggler", "1:1.5", "--tune", "rebalance", "--gpus", "8", "--steps", "400"]


def share_rows(out: str) -> dict[str, list[str]]:
    """The share table's rows by their rank label: ``{"1": ["256*", "204*", ..., "178"], ...}`` (the stretches and
    the final share)."""
    rows = {}
    for line in out.split("rebalance: each rank's share")[1].split("result (simulated)")[0].splitlines():
        match = re.match(r"\s*(\d+|other \d+)\s+((?:\d+\*?\s+)+)\d+%\s*$", line)
        if match:
            rows[match.group(1)] = match.group(2).split()
    return rows


def test_a_static_straggler_gets_fewer_samples_and_the_job_runs_faster(state: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(REBALANCE, capsys)
    assert code == 0, err
    assert "Traceback" not in out + err and err == ""
    # 1. the shares over the job: even at first, the straggler's share cut, the others' raised
    assert "each rank's share of the 2,048-sample global batch over the job" in out
    rows = share_rows(out)
    assert set(rows) == {str(r) for r in range(8)}
    assert rows["1"][0].rstrip("*") == "256"
    final = {rank: int(cells[-1]) for rank, cells in rows.items()}
    assert sum(final.values()) == 2048 and final["1"] == min(final.values()) < 256
    assert "per-rank slowdown: each rank's SM clock" not in out  # the clocks were not tuned
    # 2. the result: throughput against no tuning and against the ideal
    throughput = re.search(r"throughput\s+([\d,.]+) samples/s\s+([\d,.]+) samples/s", out)
    assert throughput is not None
    base, tuned = (float(throughput.group(i).replace(",", "")) for i in (1, 2))
    assert tuned > 1.2 * base
    shares_of_ideal = re.search(r"of the ideal\s+([\d.]+)%\s+([\d.]+)%", out)
    assert shares_of_ideal is not None and float(shares_of_ideal.group(1)) < float(shares_of_ideal.group(2)) < 100
    for row in ("throughput gained", "ideal throughput (noise-free)", "gap to the ideal closed", "energy saved",
                "share changes", "energy per sample"):
        assert re.search(rf"^\s*{re.escape(row)}\s", out, re.MULTILINE), row
    # 3. the final shares in a line, and the caption
    assert re.search(rf"final shares \(simulated\): rank 1: {final['1']} of 2,048 samples; the other 7: \d+(-\d+)?; "
                     r"1 share change", out), out
    assert "All figures are simulated, not measured (8 x A40, resnet50" in out
    assert "a rank's compute time is taken as linear in its share" in out
    assert not state.exists() or not list(state.rglob("*"))  # no journal or knob-state file left


def test_with_per_rank_slowdown_too_either_order(state: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    outputs = []
    for knob in ("rebalance,stragglers", "stragglers,rebalance"):
        path = tmp_path / f"{knob}.json"
        code, out, err = run([*REBALANCE[:4], knob, *REBALANCE[5:], "--json", str(path)], capsys)
        assert code == 0, err
        assert "rebalance + per-rank slowdown" in out and "per-rank slowdown: each rank's SM clock" in out
        outputs.append(json.loads(path.read_text()))
    first, second = outputs
    assert first["rebalanced"] == second["rebalanced"] and first["shares"] == second["shares"]
    assert first["knob"] == "rebalance,stragglers" and first["per_rank_slowdown"] is True


def test_json_has_the_shares_over_time(state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rebalance.json"
    code, out, err = run([*REBALANCE, "--json", str(path)], capsys)
    assert code == 0, err
    data = json.loads(path.read_text())
    assert data["schema"] == "dtpo.simulate/1" and data["knob"] == "rebalance" and data["simulated"] is True
    assert data["global_batch"] == 2048 and data["per_rank_slowdown"] is False and "clocks" not in data
    base, tuned = data["no_tuning"], data["rebalanced"]
    for run_ in (base, tuned):
        assert run_["samples"] == 2048 * 400
        assert run_["samples_per_s"] == pytest.approx(run_["samples"] / run_["time_s"])
        assert run_["ideal_share"] == pytest.approx(run_["samples_per_s"] / data["ideal_samples_per_s"])
    assert data["throughput_gain_share"] == pytest.approx(tuned["samples_per_s"] / base["samples_per_s"] - 1)
    assert data["throughput_gain_share"] > 0.2
    shares = data["shares"]
    assert len(shares["per_window"]) == 400 // 20 and all(sum(row) == 2048 for row in shares["per_window"])
    assert shares["per_window"][0] == [256] * 8 and shares["per_window"][-1] == data["final_shares"]
    windows = shares["per_window"]
    assert data["share_changes"] == sum(a != b for a, b in zip(windows, windows[1:], strict=False))
    assert shares["segments"][0]["first_step"] == 0 and shares["segments"][-1]["last_step"] == 399
    assert data["recommendations"] == []


def test_a_rank_many_times_slower_gets_a_recommendation(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["simulate", "--straggler", "2:5", "--tune", "rebalance", "--gpus", "4", "--steps", "400"],
                         capsys)
    assert code == 0, err
    assert re.search(r"^recommendation \(simulated\): rank 2 has computed .* restart the job without its node$", out,
                     re.MULTILINE), out


@pytest.mark.parametrize(("args", "message"), [
    (["--straggler", "0:1.5", "--tune", "rebalance", "--gpus", "1"], "--tune rebalance needs --gpus 2 or more"),
    (["--straggler", "0:1.5", "--tune", "rebalance,stragglers", "--gpus", "1"],
     "--tune rebalance,stragglers needs --gpus 2 or more"),
    (["--tune", "rebalance"], "--tune rebalance needs at least one --straggler RANK:FACTOR"),
    (["--straggler", "1:1.5", "--tune", "rebalance,power-limit"],
     "--tune rebalance combines only with stragglers (rebalance,stragglers), got 'rebalance,power-limit'"),
    (["--straggler", "1:1.5", "--tune", "rebalance", "--power-limit", "200"], "--tune rebalance chooses each rank's"),
    (["--straggler", "1:1.5", "--tune", "rebalance", "--cost", "energy"], "--tune rebalance does not use --cost"),
    (["--straggler", "9:1.5", "--tune", "rebalance"], "straggler rank 9 is not one of the 8 ranks"),
])
def test_bad_requests_are_one_line_and_exit_2(args: list[str], message: str, state: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["simulate", "--steps", "10", *args], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: ") and message in lines[0], err
    assert "Traceback" not in out + err
    assert not list(tmp_path.rglob("*.json"))  # no results file
    assert not state.exists() or not list(state.rglob("*"))
