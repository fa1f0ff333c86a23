"""The power-swing report against the truth on simulated jobs of 8 to 4,096 GPUs, and the what-if table.

What runs: for every GPU count (``--gpus``, default 8, 64, 512 and 4096) one simulated data-parallel job with step
power phases (:func:`dtpo.simulation.power_phases.simulate_phases`: ``--gpu`` H100-SXM, ``--workload`` resnet50,
``--batch`` 2048 samples per GPU, so a step computes for about a second near the limit; ``--steps`` 40;
communication ``--comm-share`` 25 % of the compute time at idle + ``--comm-power`` 30 % of the swing; ``--noise``
1 % on every step's time and power). A sampler reads every GPU's energy counter at ``--sample-hz`` 50 Hz.

*report*: what ``dtpo report --power-swing`` computes from the sampled timelines and the step marks. For the
smallest job the run directory is written and read back exactly as the command does; for the larger ones the same
functions run on the same timelines in memory (4,096 CSV files would only time the disk).

*truth*: computed from the known phases, without the sampler: the exact piecewise-constant power of every GPU,
summed on a 1 ms grid (every bin's exact mean power). From it: mean, p5/p95 swing, the largest change over 0.1 s
and 1 s, the share of the oscillating energy per band from one periodogram of the whole signal (no Welch, no
window) over the band the report says it resolves, and the frequency of its largest peak.

*fleet*: the report's extrapolation of one GPU's swing to the job's own size by the measured cross-rank
correlation, against the true swing of the job's summed power.

Goals (exit 1 when one is missed): every figure within 5 % of the truth (band shares within 5 percentage points,
a share having no natural scale). The what-if table (power floor, GB200-like ramp limiter, GB300-like buffer,
gap filling) is printed for every job with its energy cost; it has no goal. Every figure is simulated.

Exit status: 0 all goals met, 1 a goal missed, 2 a bad flag (one line on stderr), 3 a simulation error.

    python benchmarks/power_swing.py [--gpus 8,64,512,4096] [--gpu H100-SXM] [--workload resnet50] [--batch 2048]
        [--steps 40] [--sample-hz 50] [--comm-share 0.25] [--comm-power 0.3] [--noise 0.01] [--seed 0]
        [--json FILE]
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_cli, next to this file
from bench_cli import OneLineParser  # noqa: E402

from dtpo.core.errors import DtpoError, first_line
from dtpo.simulation.job import JobConfig
from dtpo.simulation.power_phases import PhasedRun, StepPhases, simulate_phases
from dtpo.telemetry.power_fleet import fleet_figures
from dtpo.telemetry.power_swing import BANDS, RAMP_LAGS_S, PowerSeries
from dtpo.telemetry.power_swing_run import RunSwing, swing_of, swing_of_run
from dtpo.telemetry.power_swing_view import critical_share, ramp, watts
from dtpo.telemetry.report.data import load_run

log = logging.getLogger("power_swing")

PROG = "power_swing.py"
FINE_S = 1e-3  # the truth's grid
RELATIVE_GOAL = 0.05
SHARE_GOAL = 0.05  # percentage points / 100


@dataclass(frozen=True)
class Truth:
    """Figures of the exact, unsampled power of a job (or of one GPU)."""

    mean_w: float
    swing_w: float
    ramps_w_per_s: dict[float, float]
    bands: dict[str, float]
    dominant_hz: float


def truth_of(power: np.ndarray, low_hz: float, high_hz: float) -> Truth:
    """The figures of an exact power signal on the :data:`FINE_S` grid; band shares over ``low_hz``-``high_hz``."""
    p5, p95 = np.percentile(power, [5, 95])
    ramps = {}
    for lag in RAMP_LAGS_S:
        k = int(round(lag / FINE_S))
        ramps[lag] = float(np.abs(power[k:] - power[:-k]).max()) / lag
    spectrum = np.abs(np.fft.rfft(power - power.mean())) ** 2
    freqs = np.fft.rfftfreq(power.size, FINE_S)
    visible = (freqs > 0) & (freqs >= low_hz) & (freqs <= high_hz)
    total = float(spectrum[visible].sum())
    bands = {f"{lo:g}-{hi:g} Hz": float(spectrum[visible & (freqs >= lo) & (freqs < hi)].sum()) / total
             for lo, hi in BANDS if lo < high_hz}
    dominant = float(freqs[visible][int(np.argmax(spectrum[visible]))])
    return Truth(float(power.mean()), float(p95 - p5), ramps, bands, dominant)


def report_in_memory(run: PhasedRun, label: str) -> RunSwing:
    """What the report computes, from the sampled timelines held in memory (no run directory)."""
    t, watts = run.sampled()
    series = [PowerSeries(f"rank {r} / {run.device_name(r)}", t, watts[r], source="simulated", estimated=True)
              for r in range(run.ranks)]
    rate = 1.0 / float(np.median(np.diff(run.step_start_s)))
    return swing_of(label, series, [0.0] * run.ranks, rate, run.gaps(0), run.limit_w * run.ranks)


def compare(rows: list[dict[str, Any]], gpus: int, figure: str, report: float | None, truth: float,
            share: bool = False) -> None:
    """One table row: the report's figure, the truth, their difference, and whether it meets its goal."""
    if report is None:
        rows.append({"gpus": gpus, "figure": figure, "report": None, "truth": truth, "error": None, "met": False})
        return
    error = (report - truth) if share else (report / truth - 1 if truth else float("inf"))
    rows.append({"gpus": gpus, "figure": figure, "report": report, "truth": truth, "error": error,
                 "met": abs(error) <= (SHARE_GOAL if share else RELATIVE_GOAL), "share": share})


def bench_one(gpus: int, args: Any, folder: Path) -> tuple[list[dict[str, Any]], RunSwing, float]:
    """Simulate one job, compute the report's figures and the truth, and compare them."""
    config = JobConfig(args.gpu, args.workload, gpus=gpus, steps=args.steps, batch_size=args.batch,
                       noise=args.noise, seed=args.seed, counter_period_s=0.0)
    phases = StepPhases(comm_share=args.comm_share, comm_power_share=args.comm_power, sample_hz=args.sample_hz)
    started = time.perf_counter()
    run = simulate_phases(config, phases, state_folder=folder / "knobs")
    if gpus == min(args.gpus):
        swing = swing_of_run(load_run(run.write_run(folder / f"job-{gpus}")))
    else:
        swing = report_in_memory(run, f"job-{gpus}")
    t, _ = run.sampled(range(1))
    edges = np.arange(t[0] - 1 / args.sample_hz, t[-1] + FINE_S / 2, FINE_S)
    seen = swing.job.resolvable
    job = truth_of(run.mean_power(edges, summed=True), seen.low_hz, seen.high_hz)
    gpu = truth_of(run.mean_power(edges, range(1))[0], seen.low_hz, seen.high_hz)
    elapsed = time.perf_counter() - started
    rows: list[dict[str, Any]] = []
    first = swing.devices[0]
    compare(rows, gpus, "GPU 0 mean W", first.mean_w, gpu.mean_w)
    compare(rows, gpus, "GPU 0 swing W", first.swing_w, gpu.swing_w)
    compare(rows, gpus, "job mean W", swing.job.mean_w, job.mean_w)
    compare(rows, gpus, "job swing W", swing.job.swing_w, job.swing_w)
    for lag in RAMP_LAGS_S:
        compare(rows, gpus, f"job ramp {lag:g} s W/s", swing.job.ramps_w_per_s.get(lag), job.ramps_w_per_s[lag])
    compare(rows, gpus, "dominant Hz", swing.job.dominant_hz, job.dominant_hz)
    compare(rows, gpus, "step rate Hz", swing.step_rate_hz, 1.0 / float(np.median(np.diff(run.step_start_s))))
    fleet = fleet_figures(swing.devices, swing.correlation, gpus)
    compare(rows, gpus, "fleet swing W (from 1 GPU)", fleet.swing_mw[1] * 1e6, job.swing_w)
    for band in swing.job.bands:
        if band.label in job.bands:
            compare(rows, gpus, f"share {band.label}", band.share, job.bands[band.label], share=True)
    return rows, swing, elapsed


def parse(argv: Sequence[str] | None) -> Any:
    """The command line, checked (a bad flag: one line, exit 2)."""
    parser = OneLineParser(prog=PROG, description="The power-swing report against the truth on simulated jobs.")
    parser.add_argument("--gpus", default="8,64,512,4096")
    parser.add_argument("--gpu", default="H100-SXM")
    parser.add_argument("--workload", default="resnet50")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sample-hz", type=float, default=50.0)
    parser.add_argument("--comm-share", type=float, default=0.25)
    parser.add_argument("--comm-power", type=float, default=0.3)
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        args.gpus = sorted({int(g) for g in args.gpus.split(",") if g.strip()})
    except ValueError:
        parser.error(f"--gpus must be whole numbers separated by commas, got {args.gpus!r}")
    if not args.gpus or min(args.gpus) < 2:
        parser.error("--gpus must name job sizes of 2 GPUs or more")
    return args


def cell(value: float | None, share: bool = False) -> str:
    if value is None:
        return "not seen"
    return f"{100 * value:.1f} %" if share else f"{value:,.4g}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every goal is met, 1 otherwise."""
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    console = Console(width=None if sys.stdout.isatty() else 200)
    rows: list[dict[str, Any]] = []
    swings: dict[int, RunSwing] = {}
    times: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="dtpo-power-swing-") as tmp:
        os.environ["DTPO_STATE_DIR"] = str(Path(tmp) / "state")  # the simulated GPUs' knobs: never the user's
        try:
            for gpus in args.gpus:
                found, swings[gpus], times[gpus] = bench_one(gpus, args, Path(tmp))
                rows += found
        except DtpoError as exc:
            log.error("simulation failed: %s", first_line(str(exc)))
            return 3
    table = Table(title=f"power-swing report vs truth ({args.gpu}, {args.workload}, batch {args.batch}, "
                        f"{args.steps} steps, {args.sample_hz:g} Hz sampling; simulated)", title_justify="left")
    for column in ("GPUs", "figure", "report", "truth", "error", "goal"):
        table.add_column(column, justify="right")
    for r in rows:
        share = r.get("share", False)
        unit = "pp" if share else "%"
        error = "-" if r["error"] is None else f"{100 * r['error']:+.2f} {unit}"
        table.add_row(str(r["gpus"]), r["figure"], cell(r["report"], share), cell(r["truth"], share), error,
                      "[green]met[/]" if r["met"] else "[bold red]missed[/]")
    console.print(table)
    what_ifs = Table(title="what-ifs on each job's summed power (simulated)", title_justify="left")
    for column in ("GPUs", "what-if", "swing", "ramp 1 s", "0.1-20 Hz share", "energy cost", "note"):
        what_ifs.add_column(column, justify="left" if column in ("what-if", "note") else "right")
    for gpus, swing in swings.items():
        job = swing.job
        what_ifs.add_row(str(gpus), "as measured", watts(job.swing_w), ramp(job.ramps_w_per_s.get(1.0)),
                         critical_share(job), "", "")
        for w in swing.what_ifs:
            what_ifs.add_row("", f"{w.what_if.name}: {w.what_if.settings}", watts(w.figures.swing_w),
                             ramp(w.figures.ramps_w_per_s.get(1.0)), critical_share(w.figures),
                             f"{100 * w.what_if.energy_cost_share:+.2f} %", w.what_if.note)
    console.print(what_ifs)
    missed = [r for r in rows if not r["met"]]
    console.print("correlation across ranks: " + ", ".join(f"{g} GPUs {s.correlation:.3f}" for g, s in swings.items()))
    console.print("time per job (simulate + report + truth): " + ", ".join(f"{g} GPUs {t:.1f} s"
                                                                          for g, t in times.items()))
    console.print(f"goals: {len(rows) - len(missed)} of {len(rows)} figures within 5 % (shares: 5 pp) of the truth"
                  + ("" if not missed else "; missed: " + ", ".join(f"{r['gpus']} GPUs {r['figure']}" for r in missed)))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "seconds": times}, indent=1))
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
