"""The summary and the scaling table: typed records in, nothing cut when written to a pipe."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dtpo.core.measurement import Measurement
from dtpo.core.record import EnergyTotals, RankRecord, RunRecord, StepRecord
from dtpo.core.record_sections import PowerTuning, SlackSection
from dtpo.core.totals import finalize
from dtpo.telemetry.scaling import bench_table, scaling_rows
from dtpo.telemetry.summary import PIPE_WIDTH, make_console, print_summary


def record(workers: int = 2, step_s: float = 0.1, threads: int | None = 1, node: str = "n") -> RunRecord:
    ranks = []
    for r in range(workers):
        steps = [StepRecord(step=i, warmup=i < 1, samples=32, step_s=step_s, data_wait_s=0.01, compute_s=0.07,
                            tail_s=0.01, optimizer_s=0.01) for i in range(4)]
        ranks.append(RankRecord(r, r, node, "cpu", flops_per_step=1e8, steps=steps,
                                peak_flops=Measurement(1e10, "FLOP/s", "measured", "float32 mm 256x256")))
    env = {"torch_threads": threads} if threads is not None else {}
    run = RunRecord(f"run-{workers}", "completed", "t", environment=env, ranks=ranks)
    return finalize(run)


def render(run: RunRecord, console: Console | None = None) -> str:
    out = io.StringIO()
    print_summary(run, console or Console(file=out, width=PIPE_WIDTH, soft_wrap=True))
    return out.getvalue()


def test_a_console_in_a_pipe_cuts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    console = make_console()  # stdout is captured: not a terminal
    assert console.width >= PIPE_WIDTH
    long_node = "node-with-a-very-long-host-name." * 6  # wider than 120 columns by itself
    run = record(node=long_node)
    run.energy = EnergyTotals(Measurement(175_432.25, "J", "estimated", "from modelled 175432.2 J"),
                              Measurement(99.5, "W", "estimated"), Measurement(0.5, "J/sample", "estimated"),
                              Measurement(0.0487, "kWh", "estimated"),
                              Measurement(23.1, "g CO2e", "estimated", "grid intensity 475 g CO2e/kWh"),
                              by_source_j={"modelled": 175_432.25}, time_s=1763.0)
    print_summary(run, console)
    text = capsys.readouterr().out
    assert "…" not in text
    assert long_node in text and "175,432 J (estimated)  [modelled 100%]" in text
    assert "grid intensity 475 g CO2e/kWh" in text
    assert max(len(line) for line in text.splitlines()) > 120


def test_threads_per_worker_is_shown_when_recorded() -> None:
    assert "threads per worker" in render(record(threads=1))
    assert "threads per worker" not in render(record(threads=None))


def test_an_unknown_mfu_says_why_and_energy_says_not_measured() -> None:
    run = record()
    for rank in run.ranks:
        rank.flops_per_step = 1e10  # 100 GFLOP/s on a 10 GFLOP/s peak
    finalize(run)
    text = render(run)
    assert "MFU unknown: rank 0 came out at" in text and "energy" in text and "not measured" in text


def test_the_mfu_says_when_its_peak_was_measured_under_load_or_again() -> None:
    assert "MFU peak" not in render(record())  # a peak measured (or cached) on a quiet machine: nothing to say
    for note in ("cached from 2026-01-01T00:00:00+00:00: best of float32 mm 256x256 on 2 thread(s); measured under "
                 "load (load average 3.5 on 2 CPUs)",
                 "measured now: best of float32 mm 512x512 on 2 thread(s); re-measured: the cached peak (20.0 GFLOP/s, "
                 "measured 2026-01-01T00:00:00+00:00) was below a quick check (40.0 GFLOP/s)"):
        run = record()
        for rank in run.ranks:
            rank.peak_flops = Measurement(1e10, "FLOP/s", "measured", note)
        lines = render(finalize(run)).splitlines()
        mfu = next(i for i, line in enumerate(lines) if line.lstrip().startswith("MFU "))
        under = lines[mfu + 1].strip()  # right under the MFU, the whole note
        assert under.startswith(f"MFU peak: {note}")
        assert under.endswith("so the MFU may read high") is ("under load (" in note)
    run.ranks[1].peak_flops = Measurement(1e10, "FLOP/s", "measured", "measured now: ...; measured under load (x)")
    assert "(and 1 other rank note(s))" in render(finalize(run))


def test_scaling_rows_and_table_from_typed_records() -> None:
    records = {1: record(1, step_s=0.1), 2: record(2, step_s=0.125)}
    rows = scaling_rows(records)
    assert [row["workers"] for row in rows] == [1, 2]
    assert rows[0]["scaling_efficiency"]["value"] == pytest.approx(1.0)
    assert rows[1]["scaling_efficiency"]["value"] == pytest.approx(0.8)  # 2x the samples in 1.25x the time
    assert rows[1]["throughput"] == records[2].totals["throughput"].to_dict()
    assert rows[1]["energy_per_sample_j"] is None
    out = io.StringIO()
    Console(file=out, width=PIPE_WIDTH).print(bench_table(rows, "bench"))
    text = out.getvalue()
    assert "80.0" in text and "n/a" in text and "…" not in text


def test_the_tuning_line_shows_the_choice_its_cost_and_a_model_figure_as_one() -> None:
    run = record()
    run.ranks[0].tuning = PowerTuning.from_dict({
        "knob": "power-limit", "metric": "energy", "metric_description": "energy per sample", "source": "measured",
        "choice": {"power_limit_w": 200.0, "sm_clock_mhz": None}, "profiling_steps": 55,
        "profiling_cost": {"steps": 55, "time_s": 10.0, "energy_j": 2000.0, "extra_time_s": 1.5,
                           "extra_energy_j": -800.0},
        "projected_saving": {"samples": 100_000, "time_s": -30.0, "energy_j": 9000.0, "cost": 9000.0,
                             "cost_fraction": 0.19},
        "profile": {}})
    assert run.ranks[0].tuning.report is not None
    text = " ".join(render(run).split())
    assert "GPU tuning 200 W for energy per sample; 55 profiling steps (+1.5 s, -0.80 kJ against the default)" in text
    assert "saves 19.0 % of the cost per sample over the remaining 100,000 samples (estimate)" in text
    assert "refined" not in text
    run.ranks[0].tuning.report["refined"] = {"against": {"power_limit_w": 175.0, "sm_clock_mhz": None},
                                      "steps_at_runner_up": 800, "steps": 1600, "outcome": "200 W held (told apart)"}
    text = " ".join(render(run).split())
    assert "near-tie with 175 W refined while training: 200 W held (told apart), 800 steps at the runner-up" in text

    run.ranks[0].tuning = PowerTuning.from_dict({
        "knob": "power-limit", "metric": "energy", "source": "model", "mode": "observe", "choice": None,
        "model": {"choice": {"power_limit_w": 250.0, "sm_clock_mhz": None}}})
    text = " ".join(render(run).split())
    assert "model figure, nothing changed (observe mode): would choose 250 W for energy" in text


def test_no_tuning_line_without_tune() -> None:
    assert "GPU tuning" not in render(record())


def test_the_straggler_line_shows_the_pace_setter_the_waiting_and_the_locked_clocks() -> None:
    run = record()
    run.ranks[0].slack = SlackSection(windows=4, steps=40, wait_s_per_step=0.03, wait_share=0.3,
                                      critical_ranks={"1": 4}, tuned=True,
                                      clock_changes=[{"window": 0, "step": 12, "clock_mhz": 1200.0,
                                                      "critical_rank": 1}])
    run.ranks[1].slack = SlackSection(windows=4, steps=40, wait_s_per_step=0.0, wait_share=0.0,
                                      critical_ranks={"1": 4}, tuned=True, clock_changes=[])
    text = " ".join(render(run).split())
    assert ("stragglers pace set by rank 1 in 100 % of windows; ranks waited 15.0 % of their step time; "
            "1 rank(s) ended locked lower (1200-1200 MHz)") in text


def test_a_restarted_run_shows_its_restarts_and_the_energy_of_every_attempt() -> None:
    from dtpo.core.record import Restart

    run = record()
    run.energy = EnergyTotals(Measurement(300.0, "J", "measured"), Measurement(30.0, "W"),
                              Measurement(0.5, "J/sample"), Measurement(300 / 3.6e6, "kWh"),
                              Measurement(0.04, "g CO2e", "estimated", "grid intensity 475 g CO2e/kWh"),
                              by_source_j={"rapl": 300.0}, time_s=10.0)
    run.restarts = [Restart(0, "failed", "killed", steps=31, energy_j=Measurement(58.5, "J", "measured"),
                            steps_lost=1, recovery_s=Measurement(10.28, "s"),
                            recovery_energy_j=Measurement(172.0, "J", "estimated"))]
    run.resumed = {"step": 30, "checkpoint": "/runs/x/checkpoints/step-000030", "load_s": 0.25}
    text = render(run)
    assert "1 (1 step(s) done again; recovery 10.3 s, 172 J (estimated))" in text
    assert "358.5 J (2 attempts, including the 1 that failed)" in text
    assert "from step 30 (/runs/x/checkpoints/step-000030)" in text
    run.restarts[0].energy_j = Measurement(58.5, "J", "estimated")
    assert "358.5 J (estimated)" in render(run)  # an estimated part makes the sum an estimate
    run.restarts[0].energy_j = None
    assert "all attempts" not in render(run)  # unknown: no sum
    run.energy = None
    assert "1 (1 step(s) done again" in render(run)  # the restarts show without energy too


def test_a_run_that_was_never_restarted_has_no_restart_lines() -> None:
    text = render(record())
    assert "restarts" not in text and "all attempts" not in text and "resumed" not in text


def test_another_frameworks_run_shows_its_mean_step_time_and_why() -> None:
    run = record()
    run.config = {"user": {"framework": "jax"}}
    text = " ".join(render(run).split())
    assert "step time (mean)" in text and "step time (median)" not in text
    assert "jax dispatches asynchronously" in text and "threads per worker" not in text
    assert "step time (median)" in render(record())


def rebalanced(workers: int = 2, changes: list[dict] | None = None, recommendations: list[str] | None = None,
               shares: list[int] | None = None, clocks: bool = False) -> RunRecord:
    """A run whose every rank carries the rebalancer's shares (as ``--tune rebalance`` writes them)."""
    run = record(workers)
    initial = [64 // workers] * workers
    changes = changes if changes is not None else []
    final = shares if shares is not None else (changes[-1]["shares"] if changes else initial)
    for rank in run.ranks:
        rank.slack = SlackSection(windows=8, steps=80, wait_s_per_step=0.01, wait_share=0.1,
                                  critical_ranks={"1": 8}, shares=list(final), initial_shares=list(initial),
                                  share_changes=list(changes), recommendations=list(recommendations or []),
                                  mode="apply" if clocks else None, clock_changes=[] if clocks else None,
                                  tuned=True if clocks else None)
    return run


TWO_CHANGES = [{"window": 2, "step": 30, "shares": [20, 44], "gain": 0.05, "slow_ranks": [0]},
               {"window": 3, "step": 40, "shares": [22, 42], "gain": 0.02, "slow_ranks": [1]}]


def test_the_rebalance_line_names_the_ranks_farthest_from_even_and_the_changes() -> None:
    text = " ".join(render(rebalanced(changes=[{"window": 3, "step": 40, "shares": [53, 11], "gain": 0.25,
                                                 "slow_ranks": [1]}])).split())
    assert ("rebalance rank 1: 11 of 64 samples per step (0.34x even) from step 40, rank 0: 53 (1.66x even) "
            "from step 40; 1 change (predicted 25.0 % shorter steps)") in text
    # Each rank from the change that gave it its final share; each change's predicted gain, not their sum.
    text = " ".join(render(rebalanced(changes=TWO_CHANGES)).split())
    assert ("rank 0: 22 of 64 samples per step (0.69x even) from step 40, rank 1: 42 (1.31x even) from step 40; "
            "2 changes (each predicted 2.0-5.0 % shorter steps)") in text
    assert "stragglers pace set by rank 1" in text  # the slack line stays
    text = " ".join(render(rebalanced(changes=TWO_CHANGES, clocks=True)).split())  # --tune rebalance,stragglers
    assert "no rank ended locked" in text and "rebalance rank 0: 22 of 64 samples per step" in text


def test_many_moved_ranks_are_cut_to_three_and_counted() -> None:
    shares = [10, 20, 6, 8, 8, 8, 2, 2]  # of 8 each: five ranks moved
    text = " ".join(render(rebalanced(8, [{"window": 4, "step": 50, "shares": shares, "gain": 0.3,
                                           "slow_ranks": [6, 7]}])).split())
    assert ("rebalance rank 1: 20 of 64 samples per step (2.50x even) from step 50, rank 6: 2 (0.25x even) from "
            "step 50, rank 7: 2 (0.25x even) from step 50, +2 more; 1 change") in text


def test_even_shares_say_so_and_no_line_without_rebalancing() -> None:
    assert "rebalance shares stayed even (no rank persistently slower)" in " ".join(render(rebalanced()).split())
    back = [*TWO_CHANGES, {"window": 5, "step": 60, "shares": [32, 32], "gain": 0.03, "slow_ranks": []}]
    assert "rebalance shares back to even from step 60 after 3 changes" in " ".join(
        render(rebalanced(changes=back)).split())
    assert "rebalance" not in render(record())
    straggling = record()
    for rank in straggling.ranks:
        rank.slack = SlackSection(windows=4, steps=40, wait_s_per_step=0.0, wait_share=0.0, critical_ranks={"0": 4},
                                  mode="apply", clock_changes=[], tuned=True)
    text = render(straggling)
    assert "stragglers" in text and "rebalance" not in text  # --tune stragglers alone


def test_each_recommendation_gets_a_line_of_its_own() -> None:
    advice = [f"rank {r} has computed 4.0x slower than the median rank for 5 windows: restart the job without its "
              "node" for r in range(5)]
    text = render(rebalanced(changes=TWO_CHANGES, recommendations=advice[:1]))
    lines = [" ".join(line.split()) for line in text.splitlines() if "restart the job" in line]
    assert lines == [f"rebalance advice {advice[0]}"]
    text = render(rebalanced(changes=TWO_CHANGES, recommendations=advice))
    lines = [" ".join(line.split()) for line in text.splitlines() if "restart the job" in line or "more (rec" in line]
    assert len(lines) == 4 and lines[0].startswith("rebalance advice") and advice[2] in lines[2]
    assert lines[3] == "+2 more (record.json: ranks[].slack.recommendations)"
    assert "rebalance advice" not in render(rebalanced(changes=TWO_CHANGES))
