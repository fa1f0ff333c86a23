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
from typing import Annotated

import typer

from dtpo.cli.register import check_result_target, save_result
from dtpo.core.errors import ConfigError
from dtpo.core.record import write_json_atomic
from dtpo.telemetry.store_paths import now_iso
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


def _fitted_fabric(fit: object, intra: str, inter: str, nics: int) -> object:
    """The fabric with the bench's fitted link inside a node (a bench runs on one host)."""
    from dtpo.plan.interconnect import find_link
    from dtpo.plan.step_model import Fabric

    intra_link, inter_link = find_link(intra), find_link(inter)
    base = Fabric.of(intra_link, inter_link, nics)
    log.info("link fitted from the bench's probe: alpha %.3g s, %.3g GB/s", fit.alpha_s,  # type: ignore[attr-defined]
             fit.bandwidth_Bps / 1e9)  # type: ignore[attr-defined]
    return Fabric(intra_link, inter_link, nics, fit.link_cost(), base.inter_cost)  # type: ignore[attr-defined]


def plan_command(
    scenario: Annotated[Path | None, typer.Argument(help="Scenario file (.toml or .json).", show_default=False)] = None,
    from_run: Annotated[Path | None, typer.Option("--from-run", help="Plan a measured dtpo run's job (with --gpu "
                                                  "and --gpu-counts).")] = None,
    from_bench: Annotated[Path | None, typer.Option("--from-bench", help="Plan a dtpo bench's job: compute from its "
                                                    "smallest run, the link's alpha and beta fitted from its link "
                                                    "probe (with --gpu cpu and --gpu-counts).")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Target GPU model for --from-run, e.g. H100.")] = None,
    gpu_counts: Annotated[str | None, typer.Option("--gpu-counts", help="GPU counts for --from-run, e.g. "
                                                   "8,64,512.")] = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node (--from-run).")] = 8,
    intra_link: Annotated[str, typer.Option("--intra-link", help="Link inside a node (--from-run).")] = "nvlink4",
    inter_link: Annotated[str, typer.Option("--inter-link", help="Link between nodes (--from-run).")] = "ib-ndr",
    nics_per_node: Annotated[int, typer.Option("--nics-per-node", help="NICs per node (--from-run).")] = 8,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Accumulation at scale (--from-run).")] = 1,
    compare_link: Annotated[str | None, typer.Option("--compare-link", help="Also predict on these inter-node "
                                                     "links, comma-separated (e.g. roce-100g).")] = None,
    deadline: Annotated[float | None, typer.Option("--deadline", help="Hours: the cheapest configuration that "
                                                   "finishes the scenario's work in time.")] = None,
    budget: Annotated[float | None, typer.Option("--budget", help="Money: the fastest configuration that costs "
                                                 "at most this.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write throughput, efficiency and J/sample against "
                                              "GPUs to FILE.png or FILE.svg.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the predictions as JSON.")] = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Write the predictions here as plan.json "
                                                 "(default: runs/plan-<run id>).", show_default=False)] = None,
    store: Annotated[str | None, typer.Option("--store", help="SQLite run store the plan is registered in "
                                              "(default: $DTPO_STORE, else runs/dtpo.sqlite).",
                                              show_default=False)] = None,
) -> None:
    """Predict how a data-parallel job scales to many GPUs: time, throughput, efficiency, energy and cost."""
    from dtpo.plan.interconnect import find_link
    from dtpo.plan.predict import cheapest, plan
    from dtpo.plan.report import PLOT_SUFFIXES, assumptions_text, plan_dict, plan_table, write_plot
    from dtpo.plan.scenario_reader import load_scenario, scenario_from_dict

    if sum(x is not None for x in (scenario, from_run, from_bench)) != 1:
        raise ConfigError("give one of: a scenario file, --from-run RUN_DIR, --from-bench BENCH_DIR")
    if deadline is not None and budget is not None:
        raise ConfigError("give --deadline or --budget, not both")
    for name, value in (("--deadline", deadline), ("--budget", budget)):
        if value is not None and not value > 0:
            raise ConfigError(f"{name} must be positive, got {value:g}")
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(f"--plot must end in {', '.join(PLOT_SUFFIXES)}, got {plot.name!r}")
    check_result_target("plan", run_dir, store)
    started_at = now_iso()
    fabric = None
    if scenario is not None:
        chosen = load_scenario(scenario)
    else:
        run = from_run
        if from_bench is not None:
            run, fit = _bench_inputs(from_bench)
            fabric = _fitted_fabric(fit, intra_link, inter_link, nics_per_node)
        assert run is not None
        chosen = scenario_from_dict(_scenario_from_run(run, gpu, gpu_counts, gpus_per_node, intra_link,
                                                       inter_link, nics_per_node, grad_accum), where="--from-run")
    others = [find_link(n.strip()).name for n in compare_link.split(",")] if compare_link else []
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
    if json_path is not None:
        write_json_atomic(json_path, data)
        console.print(f"predictions: {json_path}")
    save_result("plan", data, run_dir, store, started_at, console)
    log.debug("planned %s", json.dumps([r.fabric.inter.name for r in results]))
