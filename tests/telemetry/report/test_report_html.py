"""The self-contained HTML report: figures present as inline SVG, strings escaped, missing parts said in a line,
several runs compared, nothing to load from elsewhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.core.measurement import Measurement
from dtpo.core.record import EnergyTotals, RankRecord, RunRecord, StepRecord
from dtpo.core.record_sections import tuning_from_dict
from dtpo.telemetry.report.data import RunData, load_input
from dtpo.telemetry.report.html import build_report, render_report, write_report
from dtpo.telemetry.report.svg import inline_svg, thin
from dtpo.telemetry.trace import TIMELINE_START, power_timeline_path

T0 = 1_800_000_000.0
EVIL = '<b>&"x"'  # must reach the page escaped


def _steps(rank: int, n: int = 6) -> list[StepRecord]:
    return [StepRecord(step=i, warmup=i < 2, samples=8, step_s=0.1 + 0.01 * rank, data_wait_s=0.01, compute_s=0.06,
                       tail_s=0.02, optimizer_s=0.01, comm_exposed_s=0.015, sync_wait_s=0.005, loss=1.0,
                       started_at=T0 + 0.1 * i) for i in range(n)]


def _job_report() -> dict:
    def row(accum: int, jps: float, status: str, guard: dict | None = None) -> dict:
        return {"precision": "32-true", "grad_accum": accum, "compression": "none", "powersgd_rank": 1, "steps": 4,
                "time_per_sample_s": 1e-3, "energy_per_sample_j": jps, "cost": jps, "cost_low": jps * 0.9,
                "cost_high": jps * 1.1, "status": status, "reason": "", "samples_per_s": 1000.0,
                "comm_share": 0.1, "guard": guard}

    return {"kind": "job", "knob": "precision,grad-accum", "metric": "energy", "metric_description": "energy per "
            "sample", "unit": "J/sample", "choice": {"precision": "32-true", "grad_accum": 1, "compression": "none",
                                                     "powersgd_rank": 1},
            "settings": [row(1, 0.004, "chosen"), row(2, 0.005, "dropped"),
                         row(4, 0.006, "rejected", {"accepted": False, "reason": "loss rose"})],
            "rejected": [{"precision": "16-mixed", "grad_accum": 1, "compression": "none", "label": "16-mixed, "
                          "accum 1, none", "accepted": False, "reason": "gradients diverge"}],
            "screened": {"precision bf16-mixed": "slow here"},
            "trajectory": [{"step": 3, "setting": "32-true, accum 1, none", "phase": "profile", "steps": 2,
                            "time_s": 0.2, "energy_j": 0.064, "samples": 16}]}


def _energy() -> EnergyTotals:
    est = "estimated"
    return EnergyTotals(energy_j=Measurement(30.0, "J", est), average_power_w=Measurement(15.0, "W", est),
                        energy_per_sample_j=Measurement(0.005, "J/sample", est), kwh=Measurement(1e-5, "kWh", est),
                        co2_g=Measurement(0.004, "g CO2e", est, "grid intensity 475 g CO2e/kWh"),
                        by_source_j={"modelled": 30.0}, time_s=2.0)


def make_run(folder: Path, run_id: str = "run-a", energy: bool = True, tuned: bool = True) -> Path:
    """A two-rank run directory written by hand (record, and a power timeline when ``energy``)."""
    ranks = [RankRecord(r, r, "host", "cpu", steps=_steps(r)) for r in range(2)]
    if energy:
        ranks[0].energy = {TIMELINE_START: T0 - 0.2, "devices": [
            {"name": "cpu (modelled)", "source": "modelled", "estimated": True, "detail": "TDP share"}],
            "run": {"energy_j": {"cpu (modelled)": 30.0}, "sources": {"cpu (modelled)": "modelled"}}}
        csv = power_timeline_path(folder, 0)
        csv.parent.mkdir(parents=True)
        csv.write_text("t_s,cpu (modelled) [W]\n" + "".join(f"{0.1 * i:.3f},{10 + i % 3}\n" for i in range(12)))
    if tuned:
        ranks[0].tuning = tuning_from_dict(_job_report())
        ranks[0].switches = [{"step": 3, "setting": "grad_accum", "value": 2}]
    totals = {"throughput": Measurement(160.0, "samples/s", "derived"),
              "step_time_s": Measurement(0.1, "s", "derived", EVIL)}
    record = RunRecord(run_id=run_id, status="completed", started_at="2026-01-01T00:00:00+00:00", ranks=ranks,
                       totals=totals, energy=_energy() if energy else None,
                       config={"workload": {"name": "<script>alert(1)</script>"}}, environment={"python": "3.11"})
    record.save(folder)
    return folder


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_report([make_run(tmp_path_factory.mktemp("r") / "run", run_id=EVIL)])


def figure_ids(page: str) -> set[str]:
    """Ids of the figures that hold an inline SVG."""
    return set(re.findall(r'<figure id="([^"]+)" class="plot"><svg\b', page))


def test_a_run_report_draws_every_figure_inline(one_run: str) -> None:
    assert figure_ids(one_run) == {"run-1-breakdown", "run-1-step-time", "run-1-power", "run-1-energy-sources",
                                   "run-1-job-tuning", "run-1-swing-plot"}
    assert one_run.startswith("<!DOCTYPE html>") and "<?xml" not in one_run and "<!DOCTYPE svg" not in one_run
    for heading in ("Key figures", "Contents", "Where the step time went", "Power and energy", "Tuning",
                    "Configuration and environment", "About these figures"):
        assert heading in one_run
    assert 'class="badge est">estimated<' in one_run  # estimated energy is labelled
    assert "rejected by the guard before training" in one_run and "slow here" in one_run


def test_the_report_is_self_contained_and_escapes_what_records_hold(one_run: str) -> None:
    assert "<script" not in one_run.lower()
    assert not re.search(r"https?://", one_run)
    assert not re.search(r"\b(src|@import)\b", one_run)
    assert EVIL not in one_run and "&lt;b&gt;&amp;&quot;x&quot;" in one_run
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in one_run


def test_no_id_is_used_twice(one_run: str) -> None:
    ids = re.findall(r'\bid="([^"]+)"', one_run)
    assert len(ids) == len(set(ids)) and len(ids) > 50
    # Every in-page reference points at an id of the page.
    refs = set(re.findall(r'href="#([^"]+)"', one_run)) | set(re.findall(r"url\(#([^)]+)\)", one_run))
    assert refs <= set(ids)


def test_a_run_without_energy_or_tuning_says_so_in_one_line(tmp_path: Path) -> None:
    page = build_report([make_run(tmp_path / "bare", energy=False, tuned=False)])
    assert "Energy was not measured in this run." in page and "Nothing was tuned in this run." in page
    assert figure_ids(page) == {"run-1-breakdown", "run-1-step-time"}
    assert 'id="run-1-energy"' not in page and 'id="run-1-tuning"' not in page
    assert "Comparison" not in page


def test_two_runs_are_compared(tmp_path: Path) -> None:
    a = RunData(tmp_path / "a", RunRecord.load(make_run(tmp_path / "a", energy=False, tuned=False)))
    b = RunData(tmp_path / "b", RunRecord.load(make_run(tmp_path / "b", energy=False, tuned=False)))
    b.record.config = {"workload": {"name": "lm"}}
    page = render_report([a, b])
    assert {"comparison-breakdown", "comparison-totals"} <= figure_ids(page)
    assert 'id="comparison"' in page and "configuration differences" in page
    assert "run-a (2)" in page  # two runs of one name are told apart
    assert page.index('id="comparison"') < page.index('id="run-1"')


def test_bench_plan_and_simulation_each_get_their_curves(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    rows = [{"workers": w, "throughput": {"value": 100.0 * w ** 0.8, "unit": "samples/s", "source": "derived"},
             "scaling_efficiency": {"value": w ** -0.2, "unit": "fraction", "source": "derived"},
             "energy_per_sample_j": {"value": 0.01, "unit": "J/sample", "source": "estimated"}} for w in (1, 2)]
    (bench / "bench.json").write_text(json.dumps({"schema": "dtpo.bench/1", "workload": "mlp", "rows": rows}))
    plan = tmp_path / "plan"
    plan.mkdir()
    predictions = [{"gpus": g, "nodes": g // 8, "grad_accum": 1, "step_s": 0.1, "throughput": 80.0 * g,
                    "scaling_efficiency": 1.0 - g / 1000, "joules_per_sample": 40.0 + g / 100, "limit": "compute",
                    "extrapolated": g > 8} for g in (8, 16, 32)]
    (plan / "plan.json").write_text(json.dumps({"plans": [{"gpu": "H100", "intra_link": "nvlink4",
                                                          "inter_link": "ib-ndr", "calibration": "measured",
                                                          "assumptions": ["PUE 1.2"], "predictions": predictions}]}))
    sim = tmp_path / "sim"
    sim.mkdir()
    results = [{"power_limit_w": p, "sm_clock_mhz": None, "joules_per_sample": 1.0 - p / 1000,
                "samples_per_s": p * 2.0} for p in (100.0, 200.0, 300.0)]
    tuning = {"metric": "zeus:0.5", "unit": "J/sample", "choice": {"power_limit_w": 200.0, "sm_clock_mhz": None},
              "settings": [{**r, "cost": r["joules_per_sample"], "status": s} for r, s in zip(
                  results, ("dropped", "chosen", "measured"), strict=True)],
              "segments": [{"power_limit_w": 300.0, "sm_clock_mhz": None, "phase": "profile", "steps": 5},
                           {"power_limit_w": 200.0, "sm_clock_mhz": None, "phase": "hold", "steps": 20}]}
    (sim / "simulate.json").write_text(json.dumps({"schema": "dtpo.simulate/1", "gpu": "A40", "results": results,
                                                   "baseline": results[-1], "tuning": tuning,
                                                   "assumptions": ["a model"]}))
    page = build_report([bench, plan / "plan.json", sim])
    assert figure_ids(page) == {"bench-1-scaling", "plan-2-curves", "simulate-3-sweep", "simulate-3-tuning"}
    assert "model predictions, estimated" in page and 'class="badge sim">simulated<' in page
    assert "Comparison" not in page  # one input of each kind: nothing to compare


def test_paths_that_are_not_dtpo_outputs_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "record.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    for path, message in ((tmp_path / "missing", "does not exist"), (tmp_path / "empty", "not a dtpo run directory"),
                          (tmp_path / "bad", "not valid JSON"), (tmp_path / "other.json", "no known schema")):
        with pytest.raises(ConfigError, match=message) as caught:
            load_input(path)
        assert "\n" not in str(caught.value)


def test_write_report_replaces_the_file_atomically(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", energy=False, tuned=False)
    out = write_report([run], run / "report.html")
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in run.iterdir()) == ["record.json", "report.html"]


def test_helpers_thin_long_series_and_prefix_svg_ids() -> None:
    xs, ys, k = thin(list(range(10)), [float(i) for i in range(10)], limit=4)
    assert k == 3 and xs == [1.0, 4.0, 7.0, 9.0] and ys == [1.0, 4.0, 7.0, 9.0]
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><g id="a" clip-path="url(#c)"><use xlink:href="#m"/></g></svg>'
    assert inline_svg(svg, "f") == '<svg><g id="f-a" clip-path="url(#f-c)"><use xlink:href="#f-m"/></g></svg>'


def _rebalance(run_dir: Path, world: int = 2, changes: list[dict] | None = None,
               recommendations: list[str] | None = None) -> RunData:
    """A run directory's record with the rebalancer's shares on every rank (as ``--tune rebalance`` writes them)."""
    from dtpo.core.record_sections import SlackSection

    record = RunRecord.load(make_run(run_dir, energy=False, tuned=False))
    even = [64 // world] * world
    final = changes[-1]["shares"] if changes else even
    ranks = [RankRecord(r, r, "host", "cpu", steps=_steps(r, 90)) for r in range(world)]
    for rank in ranks:
        rank.slack = SlackSection(windows=9, steps=90, wait_s_per_step=0.01, wait_share=0.1, critical_ranks={"1": 9},
                                  shares=list(final), initial_shares=even, share_changes=list(changes or []),
                                  recommendations=list(recommendations or []))
    record.ranks = ranks
    record.config = {"tune": {"knob": "rebalance"}}
    return RunData(run_dir, record)


def _figure(page: str, fid: str) -> str:
    """The ``<figure>`` element of id ``fid``."""
    start = page.index(f'<figure id="{fid}"')
    return page[start:page.index("</figure>", start)]


def test_a_rebalanced_run_draws_its_shares_over_time(tmp_path: Path) -> None:
    changes = [{"window": 2, "step": 30, "shares": [24, 40], "gain": 0.08, "slow_ranks": [0]},
               {"window": 4, "step": 50, "shares": [22, 42], "gain": 0.03, "slow_ranks": [0]}]
    advice = ["rank 0 has computed 3.5x slower than the median rank for 5 windows: restart the job without its node"]
    page = render_report([_rebalance(tmp_path / "rb", changes=changes, recommendations=advice)])
    assert "run-1-shares" in figure_ids(page)
    shown = _figure(page, "run-1-shares")
    assert "each rank's share of the global batch (64 samples per step)" in shown
    assert "samples per step" in shown and "rank 0" in shown and "rank 1" in shown and "even share" in shown
    caption = re.search(r"<figcaption>(.*?)</figcaption>", shown, re.S).group(1)
    assert "out of a global batch of 64 that stays the same at every step" in caption
    assert ("They start at the even split (32 each) and changed 2 times (dotted): from step 30 (predicted 8.0 % "
            "shorter steps), from step 50 (3.0 %).") in caption
    assert "At the end, farthest from even: rank 0 at 22 (0.69x even), rank 1 at 42 (1.31x even)." in caption
    assert "Rebalance: rank 0: 22 of 64 samples per step (0.69x even) from step 50" in page
    assert "restart the job without its node" in page
    # A rebalance that never moved still shows its (flat) shares, and says why they stayed.
    page = render_report([_rebalance(tmp_path / "even")])
    assert "run-1-shares" in figure_ids(page)
    assert "The shares stayed at the even split (32 each): no rank was persistently slower" in page


def test_no_shares_figure_without_rebalancing(tmp_path: Path, one_run: str) -> None:
    from dtpo.core.record_sections import SlackSection

    assert not any(f.endswith("-shares") for f in figure_ids(one_run))
    data = _rebalance(tmp_path / "stragglers")
    for rank in data.record.ranks:  # --tune stragglers alone: slack, clock changes, no shares
        rank.slack = SlackSection(windows=9, steps=90, wait_s_per_step=0.01, wait_share=0.1, critical_ranks={"1": 9},
                                  mode="apply", clock_changes=[], tuned=True)
    page = render_report([data])
    assert "Stragglers:" in page and "Rebalance:" not in page
    assert not any(f.endswith("-shares") for f in figure_ids(page))


def test_a_large_world_draws_the_ranks_that_moved_and_the_others_as_one() -> None:
    from dtpo.telemetry.rebalance import SharesOverRun
    from dtpo.telemetry.report.curves import shares_plan, shares_svg
    from dtpo.telemetry.report.sections import shares_caption

    world = 64
    moved = [8] * world
    for r in range(10):  # ten slow ranks, from 2 to 7 samples; rank 63 takes what they gave up
        moved[r] = 2 + r // 2
    moved[63] += 8 * world - sum(moved)
    run = SharesOverRun(tuple([8] * world), tuple(moved), ({"step": 40, "shares": moved, "gain": 0.4},), ())
    drawn, others = shares_plan(run)
    assert len(drawn) == 8 and 63 in drawn and {0, 1} <= set(drawn) and len(others) == world - 8
    svg = shares_svg(run, 99)
    assert svg is not None and "other 56 ranks (mean; band: min-max)" in svg and "rank 63" in svg
    assert "the 8 ranks whose share moved most; the other 56 as one line" in shares_caption(run)
