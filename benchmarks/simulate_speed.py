"""Speed of the GPU simulator (goal: a 10,000-step job on 64 simulated GPUs in under one second).

Times, on the wall clock, a whole simulated job as ``dtpo simulate`` runs it: opening 64 simulated GPUs
(one shared state file), setting a power limit and an SM clock on them through the journaled knob controller,
10,000 synchronous steps with noise and a straggler, reading the energy counters, restoring the original
settings. Repeats it and reports the median. Prints a table and exits 1 when the goal is missed.

    python benchmarks/simulate_speed.py [--gpus 64] [--steps 10000] [--repeats 5] [--gpu H100-SXM]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

GOAL_S = 1.0


def one_job(gpu: str, workload: str, gpus: int, steps: int) -> tuple[float, float, float]:
    """Wall seconds of (the whole job, the steps alone), and the simulated job time in seconds."""
    from dtpo.simulation.data_parallel import SimulatedJob
    from dtpo.simulation.job import JobConfig

    started = time.perf_counter()
    with SimulatedJob(JobConfig(gpu, workload, gpus=gpus, steps=steps, stragglers=((gpus - 1, 1.1),))) as job:
        spec = job.model.spec
        # knob changes first (one journal entry and one state file for all GPUs), so the step timing is the steps alone
        job.controller.set_power_limit(job.gpus, round(0.6 * spec.max_power_w))
        job.controller.lock_sm_clock(job.gpus, spec.sm_clocks_mhz[len(spec.sm_clocks_mhz) * 3 // 4])
        steps_started = time.perf_counter()
        result = job.run(round(0.6 * spec.max_power_w), spec.sm_clocks_mhz[len(spec.sm_clocks_mhz) * 3 // 4])
        steps_s = time.perf_counter() - steps_started
    return time.perf_counter() - started, steps_s, result.time_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpu", default="H100-SXM")
    parser.add_argument("--workload", default="resnet50")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        os.environ["DTPO_STATE_DIR"] = state  # a private journal: never the machine's
        import dtpo.simulation.data_parallel  # noqa: F401 - import time is not the job's
        runs = [one_job(args.gpu, args.workload, args.gpus, args.steps) for _ in range(args.repeats)]
    whole = statistics.median(r[0] for r in runs)
    steps = statistics.median(r[1] for r in runs)
    table = Table(title=f"simulate_speed: {args.steps:,} steps x {args.gpus} simulated {args.gpu} ({args.workload}), "
                  f"median of {args.repeats}", title_justify="left")
    for column in ("measure", "wall s", "goal", "verdict"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    ok = whole < GOAL_S
    table.add_row("whole job (open, knobs, steps, restore)", f"{whole:.3f}", f"< {GOAL_S:g}",
                  "[green]met[/]" if ok else "[red]missed[/]")
    table.add_row("steps alone", f"{steps:.3f}", "", "")
    table.add_row("simulated training time", f"{runs[0][2]:,.0f} (simulated s)", "", "")
    Console().print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
