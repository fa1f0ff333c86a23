"""The planner end to end: step model, calibration, predictions against published scaling, ``dtpo plan``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from dtpo.core.errors import ConfigError
from dtpo.plan.calibration import calibrate, compute_jitter_cv, from_run
from dtpo.plan.collectives import LinkCost
from dtpo.plan.interconnect import find_link
from dtpo.plan.predict import PARTIAL_NODE_CAVEAT, SINGLE_NODE_CAVEAT, cheapest, fabric_of, limiting_term, plan
from dtpo.plan.scenario import Scenario
from dtpo.plan.scenario_reader import load_scenario, scenario_from_dict
from dtpo.plan.step_model import Fabric, JobShape, StepTime, expected_max_normal, step_time

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT.parent / "shared" / "data" / "scaling" / "published_scaling.json"
EXAMPLES = ROOT / "examples" / "plan"


def fabric(intra_Bps: float = 100e9, inter_Bps: float = 10e9) -> Fabric:
    return Fabric(find_link("nvlink3"), find_link("ib-hdr"), 1, LinkCost(0.0, intra_Bps), LinkCost(0.0, inter_Bps))


def test_a_step_adds_compute_exposed_communication_and_the_optimizer() -> None:
    job = JobShape(gradient_bytes=400e6, parameters=100e6, overlap=False)
    step = step_time(16, 8, t_micro_s=0.1, grad_accum=4, optimizer_s=0.01, job=job, fabric=fabric())
    # hand-computed: reduce-scatter + all-gather inside 8 GPUs at 100 GB/s = 2 x 7/8 x 400 MB / 100 GB/s = 7 ms;
    # across 2 nodes at 10 GB/s a ring moves 2 x 1/2 x 400 MB = 400 MB: 40 ms; 47 ms in all, none hidden
    assert step.comm_s == pytest.approx(0.047, rel=1e-6)
    assert step.exposed_comm_s == pytest.approx(step.comm_s)
    assert step.step_s == pytest.approx(0.4 + 0.047 + 0.01, rel=1e-6)
    hidden = step_time(16, 8, 0.1, 4, 0.01, JobShape(gradient_bytes=400e6, parameters=100e6), fabric())
    assert hidden.comm_s == pytest.approx(step.comm_s)
    assert 0 < hidden.exposed_comm_s < step.exposed_comm_s  # buckets overlap the last backward
    alone = step_time(1, 8, 0.1, 4, 0.01, job, fabric())
    assert alone.comm_s == 0 and alone.step_s == pytest.approx(0.41)


def test_a_cpu_job_pays_for_the_collectives_cpu_work_done_while_backward_runs() -> None:
    # one node of 2 CPU workers, 20 MB of gradient in DDP's buckets (1 MiB first, then a 10 MB cap: 1,048,576,
    # 10,000,000 and 8,951,424 bytes), a loopback of 1 GB/s whose all-reduce costs 0.5 CPU ns per byte moved
    loopback = LinkCost(0.0, 1e9, cpu_s_per_byte=0.5e-9)
    fab = Fabric(find_link("loopback"), find_link("eth-25g-tcp"), 1, loopback, LinkCost(0.0, 1e9))
    job = JobShape(gradient_bytes=20e6, parameters=5e6, bucket_cap_bytes=10_000_000, compute_on_host=True)
    step = step_time(2, 2, t_micro_s=0.06, grad_accum=1, optimizer_s=0.0, job=job, fabric=fab)
    # hand-computed: a 2-rank ring moves each bucket once, 1 ns a byte: 1.049, 10 and 8.951 ms, 20 ms in all.
    # Backward (2/3 of 60 ms = 40 ms) readies them at 40 ms x bytes so far / 20 MB: 2.097, 22.097 and 40 ms;
    # the last runs 40-48.951 ms, so 8.951 ms is exposed and 11.049 ms hidden. The CPU work is 0.5 ns x 20 MB
    # = 10 ms, and the hidden share of it (11.049 / 20) delays backward by 5.524 ms
    assert step.comm_s == pytest.approx(0.020, rel=1e-6)
    assert step.exposed_comm_s == pytest.approx(0.008951424, rel=1e-6)
    assert step.interference_s == pytest.approx(0.010 * 0.011048576 / 0.020, rel=1e-6)
    assert step.compute_s == pytest.approx(0.06 + step.interference_s, rel=1e-9)
    assert step.step_s == pytest.approx(0.06 + 0.008951424 + 0.005524288, rel=1e-6)
    on_gpus = step_time(2, 2, 0.06, 1, 0.0, JobShape(gradient_bytes=20e6, parameters=5e6,
                                                     bucket_cap_bytes=10_000_000), fab)
    assert on_gpus.interference_s == 0 and on_gpus.step_s == pytest.approx(0.06 + 0.008951424, rel=1e-6)
    unmeasured = Fabric(fab.intra, fab.inter, 1, LinkCost(0.0, 1e9), LinkCost(0.0, 1e9))
    assert step_time(2, 2, 0.06, 1, 0.0, job, unmeasured).interference_s == 0


def test_every_ddp_bucket_pays_the_collective_latency_and_one_flat_all_reduce_pays_it_once() -> None:
    alpha = 10e-6
    latency_bound = Fabric(find_link("nvlink3"), find_link("ib-hdr"), 1, LinkCost(alpha, 1e18), LinkCost(alpha, 1e18))
    grad = 100 * 1024 * 1024  # DDP's buckets: 1 MiB, then 25 MiB ones: 1, 25, 25, 25 and the last 24 MiB
    one = 2 * 7 * alpha + 2 * alpha  # reduce-scatter + all-gather over 8 GPUs, and a 2-node ring or tree: 2 steps
    flat = step_time(16, 8, 0.1, 1, 0.0, JobShape(gradient_bytes=grad, parameters=grad / 4, overlap=False),
                     latency_bound)
    assert flat.comm_s == pytest.approx(one, rel=1e-4)
    buckets = step_time(16, 8, 0.1, 1, 0.0, JobShape(gradient_bytes=grad, parameters=grad / 4), latency_bound)
    assert buckets.comm_s == pytest.approx(5 * one, rel=1e-4)
    # the last bucket is ready when backward ends: its whole all-reduce, latency included, is exposed
    assert buckets.exposed_comm_s == pytest.approx(one, rel=1e-4)


def test_fsdp_hides_its_gathers_behind_compute_until_they_exceed_it() -> None:
    job = JobShape(gradient_bytes=400e6, parameters=100e6, strategy="fsdp", param_bytes=200e6)
    slow_compute = step_time(16, 8, 1.0, 1, 0.0, job, fabric())
    fast_compute = step_time(16, 8, 0.001, 1, 0.0, job, fabric())
    assert slow_compute.exposed_comm_s < fast_compute.exposed_comm_s
    assert fast_compute.exposed_comm_s > 0.5 * fast_compute.comm_s


def test_the_expected_slowest_of_n_gpus_in_standard_deviations() -> None:
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / 3.141592653589793 ** 0.5, rel=1e-6)  # exactly 1/sqrt(pi)
    assert expected_max_normal(3) == pytest.approx(1.5 / 3.141592653589793 ** 0.5, rel=1e-6)  # 3/(2 sqrt(pi))
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=1e-4)  # tabulated order statistics
    assert expected_max_normal(100) == pytest.approx(2.5076, abs=1e-4)


def test_a_step_waits_for_the_slowest_gpu_once_per_synchronisation() -> None:
    job = JobShape(gradient_bytes=400e6, parameters=100e6, overlap=False, jitter_cv=0.02)
    step = step_time(16, 8, t_micro_s=0.1, grad_accum=4, optimizer_s=0.01, job=job, fabric=fabric())
    # DDP: 4 micro-batches of their own, then one all-reduce: 2 % x 0.1 s x sqrt(4) x E[max of 16 normals]
    assert step.sync_wait_s == pytest.approx(0.02 * 0.1 * 2 * expected_max_normal(16), rel=1e-9)
    assert step.step_s == pytest.approx(0.4 + 0.047 + 0.01 + step.sync_wait_s, rel=1e-6)
    assert step_time(1, 8, 0.1, 4, 0.01, job, fabric()).sync_wait_s == 0  # one GPU waits for nobody
    fsdp = JobShape(gradient_bytes=400e6, parameters=100e6, strategy="fsdp", param_bytes=200e6, jitter_cv=0.02)
    # FSDP gathers the parameters at every micro-batch: it waits for the slowest every time
    assert step_time(16, 8, 0.1, 4, 0.0, fsdp, fabric()).sync_wait_s == pytest.approx(
        4 * 0.02 * 0.1 * expected_max_normal(16), rel=1e-9)


def test_communication_hidden_behind_backward_still_slows_it_on_gpus() -> None:
    plain = step_time(16, 8, 0.1, 1, 0.0, JobShape(gradient_bytes=400e6, parameters=100e6), fabric())
    shared = step_time(16, 8, 0.1, 1, 0.0, JobShape(gradient_bytes=400e6, parameters=100e6, overlap_slowdown=0.5),
                       fabric())
    hidden = plain.comm_s - plain.exposed_comm_s
    assert hidden > 0 and plain.interference_s == 0
    assert shared.interference_s == pytest.approx(0.5 * hidden, rel=1e-9)
    assert shared.step_s == pytest.approx(plain.step_s + 0.5 * hidden, rel=1e-9)
    after = JobShape(gradient_bytes=400e6, parameters=100e6, overlap=False, overlap_slowdown=0.5)
    assert step_time(16, 8, 0.1, 1, 0.0, after, fabric()).interference_s == 0  # nothing runs beside backward


def test_the_limit_is_named_from_the_largest_term() -> None:
    assert limiting_term(StepTime(8, 1, 1, 1.0, 0.5, 0.3, 0.01)).startswith("exposed communication")
    assert limiting_term(StepTime(8, 1, 1, 1.0, 0.0, 0.0, 0.5)).startswith("optimizer step")
    assert limiting_term(StepTime(8, 1, 1, 1.0, 0.01, 0.01, 0.01)).startswith("compute")
    assert limiting_term(StepTime(8, 1, 1, 1.0, 0.01, 0.01, 0.01, sync_wait_s=0.3)).startswith("waiting for the slow")
    assert limiting_term(StepTime(8, 1, 1, 1.3, 0.5, 0.01, 0.01, interference_s=0.3)).startswith(
        "communication slowing")


def _scenario(**extra: object) -> Scenario:
    data = {"gpu": "H100", "gpu_counts": [8, 64, 512], "per_gpu_batch": 8, "grad_accum": 1,
            "model": {"parameters": 1_300_000_000, "gradient_dtype": "bf16"},
            "baseline": {"gpus": 8, "throughput": 400.0},
            "prices": {"per_gpu_hour": 2.5, "per_kwh": 0.15}, "work": {"samples": 10_000_000}}
    data.update(extra)
    return scenario_from_dict(data, where="test")


def test_a_calibration_from_a_measured_throughput_reproduces_it() -> None:
    scenario = _scenario()
    result = plan(scenario)
    assert result.predictions[0].throughput == pytest.approx(400.0, rel=1e-6)
    assert result.predictions[0].scaling_efficiency == pytest.approx(1.0)
    assert [p.extrapolated for p in result.predictions] == [False, True, True]
    assert any("compute: measured 400 samples/s at 8 GPUs" in a for a in result.assumptions)
    assert any("stragglers: one micro-batch's compute varies by 2.0%" in a and "assumed" in a
               for a in result.assumptions)
    assert any("delays it by 50%" in a for a in result.assumptions)
    # the calibration takes the stragglers and the contention at 8 GPUs out of the compute time
    quiet = plan(_scenario(jitter_cv=0.0, overlap_slowdown=0.0))
    assert quiet.predictions[0].throughput == pytest.approx(400.0, rel=1e-6)
    assert quiet.calibration.t_micro_s > result.calibration.t_micro_s
    assert quiet.predictions[-1].scaling_efficiency > result.predictions[-1].scaling_efficiency
    assert any("varies by 0.0%" in a and "given" in a for a in quiet.assumptions)
    # energy covers the whole step, the wait for the slowest GPU included (at waiting power)
    assert result.predictions[-1].step.sync_wait_s > 0
    assert all(p.energy.step_s == pytest.approx(p.step.step_s) for p in result.predictions)
    # a slower fabric can only lose throughput beyond one node
    roce = plan(scenario, "roce-100g", result.calibration)
    assert roce.predictions[0].throughput == pytest.approx(result.predictions[0].throughput)
    assert roce.predictions[-1].throughput < result.predictions[-1].throughput


def test_a_calibration_carried_beyond_what_it_measured_says_what_it_cannot_see() -> None:
    across = plan(_scenario())
    assert SINGLE_NODE_CAVEAT in across.assumptions and PARTIAL_NODE_CAVEAT not in across.assumptions
    inside = plan(_scenario(gpu_counts=[1, 2, 8], baseline={"gpus": 1, "throughput": 50.0}))
    assert SINGLE_NODE_CAVEAT not in inside.assumptions and PARTIAL_NODE_CAVEAT in inside.assumptions
    two_nodes = plan(_scenario(gpu_counts=[16, 64, 512], baseline={"gpus": 16, "throughput": 800.0}))
    assert SINGLE_NODE_CAVEAT not in two_nodes.assumptions and PARTIAL_NODE_CAVEAT not in two_nodes.assumptions
    from_flops = plan(_scenario(baseline={"compute_s_per_sample": 0.02}))
    assert SINGLE_NODE_CAVEAT in from_flops.assumptions and PARTIAL_NODE_CAVEAT in from_flops.assumptions


def test_a_per_gpu_batch_that_changes_with_the_count_scales_the_micro_batchs_compute() -> None:
    fixed = plan(_scenario(jitter_cv=0.0, overlap_slowdown=0.0))
    halved = plan(_scenario(jitter_cv=0.0, overlap_slowdown=0.0, per_gpu_batch={"8": 8, "64": 8, "512": 4}))
    assert halved.predictions[0].throughput == pytest.approx(400.0, rel=1e-6)
    assert halved.predictions[1].step.step_s == pytest.approx(fixed.predictions[1].step.step_s)
    last, full = halved.predictions[-1], fixed.predictions[-1]
    assert last.step.compute_s == pytest.approx(full.step.compute_s / 2)
    assert last.samples_per_step == full.samples_per_step // 2
    assert any("per-GPU batch changes with the GPU count" in a for a in halved.assumptions)
    # calibrated at a count whose batch differs from the first count's, the time per sample is the same
    later = plan(_scenario(jitter_cv=0.0, overlap_slowdown=0.0, per_gpu_batch={"8": 4, "64": 8, "512": 8},
                           baseline={"gpus": 64, "throughput": fixed.predictions[1].throughput}))
    assert later.predictions[1].throughput == pytest.approx(fixed.predictions[1].throughput, rel=1e-6)
    assert later.predictions[0].step.compute_s == pytest.approx(fixed.predictions[0].step.compute_s / 2, rel=1e-6)


def test_a_gpu_known_only_from_its_datasheet_still_pays_for_its_optimizer_step() -> None:
    result = plan(_scenario(gpu="L40S"))
    optimizer = result.predictions[0].step.optimizer_s
    assert optimizer == pytest.approx(1_300_000_000 * 32 / 864e9)  # AdamW's 32 B per parameter at 864 GB/s
    assert any("at 0.86 TB/s" in a for a in result.assumptions)


def test_the_deadline_picks_the_cheapest_configuration_that_meets_it() -> None:
    scenario = _scenario()
    options = {(p.gpus, link): p.cost for link in ("ib-ndr", "roce-100g", "ib-hdr", "eth-25g-tcp")
               for p in plan(scenario, link).predictions}
    deadline = 5.0
    pick = cheapest(scenario, deadline_h=deadline)
    assert pick.prediction.cost is not None and pick.prediction.cost.hours <= deadline
    meeting = [c.total for c in options.values() if c is not None and c.hours <= deadline and c.total is not None]
    assert pick.prediction.cost.total == pytest.approx(min(meeting))
    with pytest.raises(ConfigError, match="no configuration finishes within 0.001 h"):
        cheapest(scenario, deadline_h=0.001)


def _write_run(run_dir: Path, device: str = "cpu", model: bool = True) -> None:
    run_dir.mkdir(parents=True)
    steps = [{"step": i, "warmup": i < 2, "samples": 32, "step_s": 0.2, "data_wait_s": 0.0, "compute_s": 0.15,
              "tail_s": 0.01, "optimizer_s": 0.02} for i in range(10)]
    rank = {"rank": 0, "local_rank": 0, "node": "vm", "device": device, "flops_per_step": 3.2e12, "steps": steps,
            "model": {"parameters": 1000, "gradient_bytes": 4000, "matrix_shapes": [[10, 100]],
                      "bucket_cap_bytes": 26214400} if model else None}
    record = {"config": {"session": {"grad_accum": 2, "precision": "32-true"}}, "ranks": [rank, {**rank, "rank": 1}],
              "energy": {"energy_j": {"value": 400.0, "source": "estimated"}, "time_s": 10.0}}
    (run_dir / "record.json").write_text(json.dumps(record))


def test_the_deadline_weighs_lower_power_limits_when_energy_is_what_costs() -> None:
    # an owned cluster pays only for energy: a lower limit is slower, but draws less for the same work
    owned = _scenario(prices={"per_gpu_hour": 0.0, "per_kwh": 0.15})
    pick = cheapest(owned, deadline_h=24.0)
    assert pick.power_limit_w is not None and pick.power_limit_w < 700.0
    assert "H100-SXM model" in pick.power_note and "bert_base_uncased/squad" in pick.power_note
    at_max = [p.cost.total for link in ("ib-ndr", "roce-100g", "ib-hdr", "eth-25g-tcp")
              for p in plan(owned, link).predictions if p.cost is not None and p.cost.hours <= 24.0]
    assert pick.prediction.cost is not None and pick.prediction.cost.total is not None
    assert pick.prediction.cost.total < min(c for c in at_max if c is not None)
    # the slower step at that limit is the model's, on compute only
    max_pick = plan(owned, pick.inter_link).predictions
    same = next(p for p in max_pick if p.gpus == pick.prediction.gpus)
    assert pick.prediction.step.compute_s > same.step.compute_s
    assert pick.prediction.step.comm_s == pytest.approx(same.step.comm_s)
    # renting by the hour, time is money: the maximum limit is the cheapest
    assert cheapest(_scenario(), deadline_h=5.0).power_limit_w is None


def test_a_run_record_gives_compute_optimizer_gradient_and_power(tmp_path: Path) -> None:
    _write_run(tmp_path / "run")
    scenario = scenario_from_dict({"gpu": "cpu", "gpu_counts": [2, 4], "gpus_per_node": 2, "per_gpu_batch": 32,
                                   "intra_link": "loopback", "inter_link": "eth-25g-tcp", "nics_per_node": 1,
                                   "model": {"gradient_bytes": 4000},
                                   "baseline": {"run_dir": str(tmp_path / "run")}, "power": {"busy_power_w": 10.0}},
                                  where="test")
    cal = from_run(scenario, tmp_path / "run")
    # 0.15 s of compute for 2 micro-batches of 16 samples, scaled to the scenario's 32: 0.15 s per micro-batch
    assert cal.t_micro_s == pytest.approx(0.15)
    assert cal.optimizer_s == pytest.approx(0.02)
    assert cal.job.gradient_bytes == 4000 and cal.job.matrix_shapes == ((10, 100),)
    assert cal.busy_power_w == pytest.approx(400.0 / 10.0 / 2)
    assert any("estimated" in a for a in cal.assumptions)
    # planning an H100 from a CPU run uses the run's counted FLOPs, at an assumed MFU
    h100 = scenario_from_dict({"gpu": "H100", "gpu_counts": [8], "per_gpu_batch": 16, "model": {"gradient_bytes": 4000},
                               "baseline": {"run_dir": str(tmp_path / "run")}}, where="test")
    flops = calibrate(h100, fabric_of(h100))
    assert "FLOPs per sample counted in dtpo run" in flops.source and flops.t_micro_s < cal.t_micro_s


def test_a_runs_compute_jitter_is_the_robust_spread_of_its_steps_per_micro_batch() -> None:
    steady = [{"compute_s": t} for t in (1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.0, 5.0)]  # one GC pause
    # median 1.0; absolute deviations 0, .02, .02, 0, .01, .01, 0, 0, 4: their median is 0.01
    assert compute_jitter_cv([{"steps": steady}], accum=1) == pytest.approx(0.014826)
    assert compute_jitter_cv([{"steps": steady}], accum=4) == pytest.approx(0.014826 / 2)  # 4 micro-batches a step
    assert compute_jitter_cv([{"steps": steady[:5]}], accum=1) is None  # too few steps to tell
    warm = [{"compute_s": 9.0, "warmup": True}] * 20
    assert compute_jitter_cv([{"steps": warm + steady}], accum=1) == pytest.approx(0.014826)


def test_a_run_without_what_the_planner_needs_is_one_clear_error(tmp_path: Path) -> None:
    _write_run(tmp_path / "old", model=False)
    scenario = scenario_from_dict({"gpu": "cpu", "gpu_counts": [2], "per_gpu_batch": 32, "model": {"gradient_bytes": 4},
                                   "baseline": {"run_dir": str(tmp_path / "old")},
                                   "power": {"busy_power_w": 10.0}}, where="test")
    with pytest.raises(ConfigError, match="has no model section"):
        from_run(scenario, tmp_path / "old")
    with pytest.raises(ConfigError, match="has no record.json"):
        from_run(scenario, tmp_path / "missing")


# -- published scaling: calibrated on the smallest point, the rest predicted ------------------------------------

def _published() -> dict[str, dict]:
    if not PUBLISHED.exists():
        pytest.skip(f"{PUBLISHED} is not beside the repository")
    return {s["id"]: s for s in json.loads(PUBLISHED.read_text())["series"]}


REPRODUCED = ["dle_pt_bert_large_ph1_fp16_dgxa100", "dle_pt_bert_large_ph1_tf32_dgxa100",
              "dle_pt_bert_large_ph2_fp16_dgxa100", "tf_dgx1_p100_synthetic_resnet50",
              pytest.param("dle_pt_bert_large_ph2_tf32_dgxa100", marks=pytest.mark.xfail(
                  strict=True, reason="known miss: at 128 and 256 GPUs the published efficiency falls to 89 % and "
                  "78 % while the same recipe in fp16 keeps 94 %: the series fits a fixed 0.35 s per optimizer "
                  "step at every count (0.025-0.043 s in its 3 sibling series), which no compute, alpha-beta, "
                  "optimizer, straggler or contention term explains"))]


@pytest.mark.parametrize("series_id", REPRODUCED)
def test_published_series_are_reproduced_from_their_smallest_point(series_id: str) -> None:
    series = _published()[series_id]
    result = plan(load_scenario(EXAMPLES / "published" / f"{series_id}.toml"))
    points = {p["gpus"]: p["throughput"] for p in series["points"]}
    base = min(points)
    for pred in result.predictions:
        published = points[pred.gpus]
        assert pred.throughput == pytest.approx(published, rel=0.10), pred.gpus
        efficiency = published / pred.gpus / (points[base] / base)
        assert abs(pred.scaling_efficiency - efficiency) <= 0.05, pred.gpus


# -- the command ---------------------------------------------------------------------------------------------------

def test_dtpo_plan_prints_the_table_the_assumptions_and_writes_the_plot(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["plan", str(EXAMPLES / "h100_ib_ndr_vs_roce.toml"), "--compare-link", "roce-100g",
                              "--plot", str(tmp_path / "plan.png"), "--json", str(tmp_path / "plan.json"),
                              "--deadline", "10"], capsys)
    assert code == 0, out + err
    assert "ib-ndr" in out and "roce-100g" in out and "limited by" in out and "assumed" in out
    assert "within 10 h, the cheapest" in out
    assert (tmp_path / "plan.png").stat().st_size > 1000
    data = json.loads((tmp_path / "plan.json").read_text())
    assert [p["inter_link"] for p in data["plans"]] == ["ib-ndr", "roce-100g"]
    assert data["choice"]["power_limit_w"] is None  # renting by the hour: the maximum limit
    assert data["choice"]["cost"]["hours"] <= 10


def test_dtpo_plan_names_the_power_limit_it_picks_and_the_model_behind_it(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    owned = (EXAMPLES / "h100_ib_ndr_vs_roce.toml").read_text().replace("per_gpu_hour = 3.0", "per_gpu_hour = 0.0")
    assert owned != (EXAMPLES / "h100_ib_ndr_vs_roce.toml").read_text()
    (tmp_path / "owned.toml").write_text(owned)
    code, out, err = run_cli(["plan", str(tmp_path / "owned.toml"), "--deadline", "24", "--json",
                              str(tmp_path / "plan.json")], capsys)
    assert code == 0, out + err
    choice = json.loads((tmp_path / "plan.json").read_text())["choice"]
    assert choice["power_limit_w"] is not None and choice["power_limit_w"] < 700
    assert f"at a {choice['power_limit_w']:g} W power limit" in out and "H100-SXM model" in out


@pytest.mark.parametrize(("args", "message"), [
    (["plan"], "give one of: a scenario file, --from-run RUN_DIR, --from-bench BENCH_DIR"),
    (["plan", "--from-bench", "nowhere", "--gpu", "cpu", "--gpu-counts", "2"], "holds no dtpo bench runs"),
    (["plan", "missing.toml"], "missing.toml"),
    (["plan", str(EXAMPLES / "bert_large_dgx_a100.toml"), "--plot", "x.gif"], "--plot must end in"),
    (["plan", str(EXAMPLES / "bert_large_dgx_a100.toml"), "--deadline", "1", "--budget", "2"], "not both"),
    (["plan", "--from-run", "nowhere", "--gpu", "H100", "--gpu-counts", "8"], "has no record.json"),
    (["plan", "--from-run", "nowhere"], "--from-run needs the target hardware"),
], ids=["nothing", "no bench", "missing file", "bad plot", "deadline and budget", "no record", "no hardware"])
def test_bad_plan_requests_are_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(args, capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_a_scenario_with_an_unknown_gpu_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('gpu = "Z9000"\ngpu_counts = [8]\nper_gpu_batch = 8\n[model]\nparameters = 10\n'
                    '[baseline]\ngpus = 8\nthroughput = 10.0\n')
    code, out, err = run_cli(["plan", str(path)], capsys)
    assert code == 2 and "gpu" in err and "Z9000" in err and len(err.strip().splitlines()) == 1


def test_plan_from_a_cpu_run_takes_its_power_and_no_node_overhead(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _write_run(tmp_path / "run")
    code, out, err = run_cli(["plan", "--from-run", str(tmp_path / "run"), "--gpu", "cpu", "--gpu-counts", "2,4",
                              "--gpus-per-node", "2", "--intra-link", "loopback", "--inter-link", "eth-25g-tcp",
                              "--nics-per-node", "1", "--json", str(tmp_path / "p.json")], capsys)
    assert code == 0, out + err
    assert "busy power 20 W per worker: given" in out  # 400 J over 10 s on 2 workers
    rows = json.loads((tmp_path / "p.json").read_text())["plans"][0]["predictions"]
    assert [r["extrapolated"] for r in rows] == [False, True]  # 4 workers span 2 nodes: beyond the run
    # 20 W for each worker's step and no node overhead: J/sample = 20 W x step / 16 samples per worker (the run's
    # micro-batch: 32 samples per step in 2 micro-batches)
    assert rows[0]["joules_per_sample"] == pytest.approx(20.0 * rows[0]["step_s"] / 16, rel=1e-6)
