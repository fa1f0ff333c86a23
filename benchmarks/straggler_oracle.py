"""The ceiling for per-rank straggler slowdown under noise: the best *static* clock lock of the waiting ranks.

For one simulated job (:class:`dtpo.simulation.job.JobConfig`, one static straggler), every rank but the
straggler is locked at one supported clock from the first step, for each clock in turn, with the same noise
draws as the untuned baseline. Each lock gives the bloat recovered and the slowdown against the baseline, as
``benchmarks/straggler_dvfs.py`` defines them; the oracle is the lock that recovers the most with a slowdown
under ``--max-slowdown``. Beside it, the online policy (:class:`dtpo.tune.straggler.StragglerSlowdown`) on the
same job. It tells whether a missed goal of ``straggler_dvfs.py`` is out of reach under the noise or left on the
table by the policy. An oracle knows the job in advance; nothing online can do better than the best lock it
finds (a static lock is one choice; a per-step oracle would know the noise draws). Every figure is simulated.

Usage: ``python benchmarks/straggler_oracle.py [--gpus 8,16,64] [--factor 1.1] [--noise 0.03]``
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from dtpo.simulation.job import JobConfig
from dtpo.simulation.stragglers import ideal_energy, run_job


def run_locked(job: JobConfig, clock: float | None, straggler: int) -> tuple[float, float]:
    """``(energy, time)`` of ``job`` with every rank but ``straggler`` locked at ``clock`` (``None``: none)."""
    locks = [None if r == straggler else clock for r in range(job.gpus)]
    result = run_job(job, tune=False, fixed_locks=locks)
    return result.energy_j, result.time_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="8,16,64")
    parser.add_argument("--factor", type=float, default=1.1)
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--gpu", default="A40")
    parser.add_argument("--workload", default="resnet50")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--max-slowdown", type=float, default=0.01)
    args = parser.parse_args()
    console = Console()
    summary = Table(title=f"Static straggler {args.factor:g}x, noise {args.noise:.0%}: the best static lock of the "
                          f"waiting ranks (slowdown < {args.max_slowdown:.0%}) against the online policy "
                          f"({args.gpu}, {args.workload}, {args.steps} steps; simulated)")
    for name in ("GPUs", "oracle lock MHz", "oracle recovered", "oracle slowdown", "policy recovered",
                 "policy slowdown"):
        summary.add_column(name, justify="right")
    for gpus in (int(g) for g in args.gpus.split(",")):
        job = JobConfig(args.gpu, args.workload, gpus=gpus, steps=args.steps, stragglers=((1, args.factor),),
                        noise=args.noise)
        full_j, jit_j = ideal_energy(job)
        bloat = full_j - jit_j
        base_e, base_t = run_locked(job, None, 1)
        tuned = run_job(job, tune=True)
        sweep = Table(title=f"{gpus} GPUs: every rank but the straggler locked at one clock")
        for name in ("clock MHz", "recovered", "slowdown"):
            sweep.add_column(name, justify="right")
        best: tuple[float, float, float] | None = None
        for clock in sorted(job.model().spec.sm_clocks_mhz, reverse=True):
            energy, time_s = run_locked(job, clock, 1)
            recovered, slowdown = (base_e - energy) / bloat, time_s / base_t - 1.0
            if recovered <= 0.0 and slowdown <= 1e-6:
                continue  # above the clock the GPU settles at by itself: the lock changes nothing
            sweep.add_row(f"{clock:.0f}", f"{recovered:.1%}", f"{slowdown:+.2%}")
            if slowdown < args.max_slowdown and (best is None or recovered > best[1]):
                best = (clock, recovered, slowdown)
            if slowdown > 5 * args.max_slowdown:
                break
        console.print(sweep)
        summary.add_row(str(gpus), f"{best[0]:.0f}" if best else "-", f"{best[1]:.1%}" if best else "-",
                        f"{best[2]:+.2%}" if best else "-", f"{(base_e - tuned.energy_j) / bloat:.1%}",
                        f"{tuned.time_s / base_t - 1.0:+.2%}")
    console.print(summary)
    console.print("every figure is simulated; recovered = (E_baseline - E) / bloat, slowdown = T / T_baseline - 1, "
                  "as in benchmarks/straggler_dvfs.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
