"""``dtpo plan``: predict step time, throughput, scaling efficiency, energy and cost at many GPUs.

Input is a scenario file (TOML or JSON, schema in :mod:`dtpo.plan.scenario`; examples in ``examples/plan/``),
or ``--from-run RUN_DIR`` with the target hardware as flags. ``--compare-link`` predicts the same job on other
inter-node links; ``--deadline`` / ``--budget`` pick the cheapest (or fastest) configuration that meets it.

Every plan writes its predictions (the JSON ``--json`` writes) into a run directory of its own,
``runs/plan-<run id>/plan.json`` (``--run-dir`` names another), and registers them in the run store (``--store``;
see ``dtpo runs``).
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

from dtpo.cli.options import config_command
from dtpo.cli.register import check_result_target, save_result
from dtpo.core.errors import ConfigError
from dtpo.core.plan_config import PlanConfig
from dtpo.core.record import write_json_atomic
from dtpo.telemetry.store.paths import now_iso
from dtpo.telemetry.summary import make_console

log = logging.getLogger(__name__)


def _scenario_from_run(run_dir: Path, gpu: str | None, counts: str | None, gpus_per_node: int, intra: str,
                       inter: str, nics: int, grad_accum: int) -> dict:
    """A scenario dict for planning ``run_dir``'s job on the hardware the flags name."""
    from dtpo.plan.calibration import read_record

    if gpu is None or counts is None:
        raise ConfigError("--from-run needs the target hardware: --gpu MODEL and --gpu-counts N,N,... "
                          "(e.g. --gpu H100 --gpu-counts 8,64,512)")
    record = read_record(run_dir)
    config = record.get("config") or {}
    session = config.get("session") or {}
    ranks = record.get("ranks") or []
    steps = [s for s in (ranks[0].get("steps") or []) if not s.get("warmup")] if ranks else []
    if not steps:
        raise ConfigError(f"{run_dir}/record.json has no measured steps")
    accum = int(session.get("grad_accum", 1))
    micro = max(int(statistics.median(s["samples"] for s in steps) // accum), 1)
    try:
        gpu_counts = [int(c) for c in counts.split(",")]
    except ValueError:
        raise ConfigError(f"--gpu-counts must be comma-separated integers, got {counts!r}") from None
    energy = record.get("energy") or {}
    joules, seconds = (energy.get("energy_j") or {}).get("value"), energy.get("time_s")
    power: dict[str, float] = {}
    if joules and seconds and gpu.lower() == "cpu":  # the run's energy already covers the whole node (CPU, DRAM)
        power = {"busy_power_w": joules / seconds / len(ranks), "node_overhead_w": 0.0}
    return {"power": power, "gpu": gpu, "gpu_counts": gpu_counts, "gpus_per_node": gpus_per_node, "intra_link": intra,
            "inter_link": inter, "nics_per_node": nics, "per_gpu_batch": micro, "grad_accum": grad_accum,
            "strategy": session.get("strategy", "ddp"), "precision": session.get("precision", "32-true"),
            "model": {"gradient_bytes": int((next((r.get("model") for r in ranks if r.get("model")), None)
                                             or {"gradient_bytes": 1})["gradient_bytes"])},
            "baseline": {"run_dir": str(run_dir)}}


def _bench_inputs(bench_dir: Path) -> tuple[Path, object]:
    """The smallest worker count's run and the alpha-beta fit of the largest count's link probe."""
    from dtpo.cli.bench import LINK_PROBE_FILE
    from dtpo.plan.link_fit import fit_link_probe

    runs = sorted((int(p.name.split("-", 1)[1]), p) for p in bench_dir.glob("workers-*")
                  if p.name.split("-", 1)[1].isdigit() and (p / "record.json").exists())
    if not runs:
        raise ConfigError(f"{bench_dir} holds no dtpo bench runs (workers-N/record.json)")
    probes = [p / LINK_PROBE_FILE for _, p in reversed(runs) if (p / LINK_PROBE_FILE).exists()]
    if not probes:
        raise ConfigError(f"{bench_dir} has no link probe (bench with 2 or more workers on gloo writes "
                          f"workers-N/{LINK_PROBE_FILE})")
    try:
        doc = json.loads(probes[0].read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {probes[0]}: {exc}") from None
    try:
        return runs[0][1], fit_link_probe(doc)
    except ConfigError as exc:
        raise ConfigError(f"{probes[0]}: {exc}") from None


def _bench_micro_batch(bench_dir: Path) -> dict:
    """The scenario's ``micro_batch`` section from a bench's runs at several batch sizes (``dtpo bench
    --batch-sizes``), or nothing where it has fewer than two."""
    from dtpo.plan.batch_fit import batch_times_from_bench

    points = batch_times_from_bench(bench_dir)
    if len({b for b, _ in points}) < 2:
        return {}
    return {"micro_batch": {"times_s": {str(b): t for b, t in points}}}


def _fitted_fabric(fit: object, intra: str, inter: str, nics: int) -> object:
    """The fabric with the bench's fitted link inside a node (a bench runs on one host)."""
    from dtpo.plan.interconnect import find_link
    from dtpo.plan.step_model import Fabric

    intra_link, inter_link = find_link(intra), find_link(inter)
    base = Fabric.of(intra_link, inter_link, nics)
    log.info("link fitted from the bench's probe: alpha %.3g s, %.3g GB/s", fit.alpha_s,  # type: ignore[attr-defined]
             fit.bandwidth_Bps / 1e9)  # type: ignore[attr-defined]
    return Fabric(intra_link, inter_link, nics, fit.link_cost(), base.inter_cost)  # type: ignore[attr-defined]


def _plan(config: PlanConfig) -> None:
    """Predict how a data-parallel job scales to many GPUs: time, throughput, efficiency, energy and cost."""
    from dtpo.plan.interconnect import find_link
    from dtpo.plan.predict import cheapest, plan
    from dtpo.plan.report import PLOT_SUFFIXES, assumptions_text, plan_dict, plan_table, write_plot
    from dtpo.plan.scenario_reader import load_scenario, scenario_from_dict

    source, target, choice, output = config.source, config.target, config.choice, config.output
    scenario, deadline, budget, plot = source.scenario, choice.deadline, choice.budget, output.plot
    run_dir, store = output.run_dir, output.store
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(f"--plot must end in {', '.join(PLOT_SUFFIXES)}, got {plot.name!r}")
    check_result_target("plan", run_dir, store)
    started_at = now_iso()
    fabric = None
    if scenario is not None:
        chosen = load_scenario(scenario)
    else:
        run = source.from_run
        if source.from_bench is not None:
            run, fit = _bench_inputs(source.from_bench)
            fabric = _fitted_fabric(fit, target.intra_link, target.inter_link, target.nics_per_node)
        assert run is not None
        data = _scenario_from_run(run, target.gpu, target.gpu_counts, target.gpus_per_node, target.intra_link,
                                  target.inter_link, target.nics_per_node, target.grad_accum)
        if source.from_bench is not None:
            data.update(_bench_micro_batch(source.from_bench))
        chosen = scenario_from_dict(data, where="--from-bench" if source.from_bench is not None else "--from-run")
    others = [find_link(n.strip()).name for n in choice.compare_link.split(",")] if choice.compare_link else []
    first = plan(chosen, fabric=fabric)
    results = [first, *(plan(chosen, link, first.calibration) for link in others if link != first.fabric.inter.name)]
    console = make_console()
    for result in results:
        console.print(plan_table(result))
    console.print("[bold]assumed[/bold]")
    for line in assumptions_text(first):
        console.print(line, markup=False, highlight=False)
    pick = None
    if deadline is not None or budget is not None:
        pick = cheapest(chosen, deadline, budget)
        cost = pick.prediction.cost
        assert cost is not None
        what = f"within {deadline:g} h, the cheapest" if deadline is not None else f"within a budget of {budget:g}, " \
            "the fastest"
        limit = "" if pick.power_limit_w is None else f" at a {pick.power_limit_w:g} W power limit"
        money = f"cost {cost.total:,.2f}" if cost.total is not None else "no prices"
        console.print(f"{what}: {pick.prediction.gpus} GPUs ({pick.prediction.step.nodes} nodes) on "
                      f"{pick.inter_link}{limit}: {cost.hours:,.2f} h, {cost.kwh:,.1f} kWh, {money}", markup=False)
        if pick.power_note:
            console.print(f"- {pick.power_note}", markup=False, highlight=False)
    if plot is not None:
        write_plot(results, plot)
        console.print(f"plot: {plot}")
    data: dict[str, object] = {"plans": [plan_dict(r) for r in results]}
    if pick is not None:
        data["choice"] = {"gpus": pick.prediction.gpus, "nodes": pick.prediction.step.nodes,
                          "inter_link": pick.inter_link, "power_limit_w": pick.power_limit_w,
                          "power_note": pick.power_note, "throughput": pick.prediction.throughput,
                          "cost": vars(pick.prediction.cost) if pick.prediction.cost is not None else None}
    if output.json is not None:
        write_json_atomic(output.json, data)
        console.print(f"predictions: {output.json}")
    save_result("plan", data, run_dir, store, started_at, console)
    log.debug("planned %s", json.dumps([r.fabric.inter.name for r in results]))


plan_command = config_command(_plan, tree=PlanConfig)
