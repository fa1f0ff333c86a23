"""The ceiling for per-rank straggler slowdown under noise: the best *static* clock lock of the waiting ranks.

For one simulated job (:class:`dtpo.tune.straggler_sim.StragglerJob`, one static straggler), every rank but the
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
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from dtpo.devices.journal import KnobJournal
from dtpo.devices.knobs import KnobController
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig
from dtpo.tune.straggler_sim import StragglerJob, ideal_energy, job_model, run_job


def run_locked(job: StragglerJob, clock: float | None, straggler: int) -> tuple[float, float]:
    """``(energy, time)`` of ``job`` with every rank but ``straggler`` locked at ``clock`` (``None``: none)."""
    model = job_model(job)
    spec = model.spec
    with tempfile.TemporaryDirectory(prefix="dtpo-oracle-") as tmp:
        folder = Path(tmp)
        ranks = [SimulatedGpu(SimulatedGpuConfig(spec.name, model.workload, model.batch_size, index=r, seed=job.seed,
                                                 time_noise=job.noise, power_noise=job.noise, counter_period_s=0.0),
                              folder / f"rank{r}.json", model=model) for r in range(job.gpus)]
        energy = time_s = 0.0
        with KnobController("apply", KnobJournal(folder / "journal.json"), log=lambda _: None) as controller:
            if clock is not None:
                for r, gpu in enumerate(ranks):
                    if r != straggler:
                        controller.lock_sm_clock(gpu, int(clock))
            done = 0
            while done < job.steps:
                n = min(job.window_steps, job.steps - done)
                drawn = [gpu.sample_steps(n) for gpu in ranks]
                compute = np.stack([t for t, _ in drawn]) * job.factors(done, n)
                step_s = compute.max(axis=0)
                for gpu, (_, powers), mine in zip(ranks, drawn, compute, strict=True):
                    energy += gpu.advance(mine, powers, step_s - mine)
                time_s += float(step_s.sum())
                done += n
        for gpu in ranks:
            gpu.forget_state_file()
    return energy, time_s


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
        job = StragglerJob(args.gpu, args.workload, gpus=gpus, steps=args.steps, stragglers=((1, args.factor),),
                           noise=args.noise)
        full_j, jit_j = ideal_energy(job)
        bloat = full_j - jit_j
        base_e, base_t = run_locked(job, None, 1)
        tuned = run_job(job, tune=True)
        sweep = Table(title=f"{gpus} GPUs: every rank but the straggler locked at one clock")
        for name in ("clock MHz", "recovered", "slowdown"):
            sweep.add_column(name, justify="right")
        best: tuple[float, float, float] | None = None
        for clock in sorted(job_model(job).spec.sm_clocks_mhz, reverse=True):
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
