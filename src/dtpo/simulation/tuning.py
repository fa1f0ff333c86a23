"""The power tuner on simulated GPUs: the same :class:`~dtpo.tune.tuner.PowerTuner`, fed by simulated steps.

:func:`tune_on_simulated` steps simulated GPUs (one :class:`~dtpo.devices.simulated.SimulatedGpu`, or the
GPUs of a :class:`~dtpo.devices.simulated.SimulatedGpuGroup`, which all run the same setting, as
:class:`~dtpo.simulation.data_parallel.SimulatedJob` builds them for a :class:`~dtpo.simulation.job.JobConfig`),
reads their energy counters exactly as a monitor reads NVML, feeds the tuner block by block, and applies each
setting it asks for through a journaled :class:`~dtpo.devices.knobs.KnobController`, until the tuner holds its
choice (and, with ``job_steps``, on to the end of the job). Every figure it returns is simulated.

:func:`true_cost` and :func:`oracle` read the model without noise: the yardstick a tuning run is judged by.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtpo.devices.base import KnobState
from dtpo.devices.journal import KnobJournal
from dtpo.devices.knobs import KnobController
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuGroup, operating_point
from dtpo.simulation.data_parallel import synchronous_steps
from dtpo.simulation.job import Progress
from dtpo.tune.cost import CostContext, CostMetric
from dtpo.tune.knob import DEFAULT_STEP_W, apply_setting, candidate_grid, make_knobs
from dtpo.tune.prior import model_guess
from dtpo.tune.setting import GpuSetting, Segment
from dtpo.tune.stats import Block
from dtpo.tune.tuner import PowerTuner, TunerOptions


@dataclass
class SimulatedTuning:
    """A tuning run on simulated GPUs.

    Attributes:
        tuner: The tuner, with its full state (``tuner.report()`` for the record).
        segments: Steps at each setting, in order (wait, warm-up, profile, hold), as measured.
        choice: The setting held at the end.
        profiling_steps: Steps from the start until the choice was held.
        steps: Steps simulated in all.
        default: The setting before tuning.
    """

    tuner: PowerTuner
    segments: list[Segment]
    choice: GpuSetting
    profiling_steps: int
    steps: int
    default: GpuSetting


def _members(gpus: SimulatedGpu | SimulatedGpuGroup) -> list[SimulatedGpu]:
    return gpus.members if isinstance(gpus, SimulatedGpuGroup) else [gpus]


def simulate_block(gpus: SimulatedGpu | SimulatedGpuGroup, steps: int) -> Block:
    """Run ``steps`` synchronous data-parallel steps at the current settings; energy read from the counters."""
    members = _members(gpus)
    before = sum(m.energy_j() for m in members)
    block = synchronous_steps(members, steps)
    energy = sum(m.energy_j() for m in members) - before
    return Block(steps, steps * members[0].model.batch_size * len(members), float(block.step_s.sum()),
                 float(energy))


def context_of(gpus: SimulatedGpu | SimulatedGpuGroup) -> CostContext:
    """GPU count and maximum power limit of simulated GPUs, for the cost metric."""
    return CostContext(gpus=len(_members(gpus)), max_power_w=gpus.model.spec.max_power_w)


def default_setting(gpus: SimulatedGpu | SimulatedGpuGroup) -> GpuSetting:
    """The maximum power limit, clocks floating."""
    return GpuSetting(gpus.model.spec.max_power_w, None)


def tune_on_simulated(gpus: SimulatedGpu | SimulatedGpuGroup, cost: CostMetric, knob: str = "power-limit",
                      max_steps: int = 10_000, job_steps: int | None = None, journal_dir: Path | None = None,
                      options: TunerOptions | None = None, step_w: float = DEFAULT_STEP_W,
                      controller: KnobController | None = None, progress: Progress | None = None,
                      use_model_guess: bool = True) -> SimulatedTuning:
    """Tune ``knob`` (``power-limit``, ``sm-clock`` or ``both``) on simulated GPUs for ``cost``.

    Args:
        gpus: The GPUs (their knobs change; they are restored before returning).
        cost: The metric to minimise.
        knob: Which knob(s).
        max_steps: Give up holding nothing after this many steps (the tuner then holds its best so far).
        job_steps: Simulate the whole job of this many steps (tuning included); ``None``: stop once holding.
        journal_dir: Folder of the knob journal (default: the machine's, so ``dtpo restore`` finds a killed
            run's changes).
        options: Search parameters.
        step_w: Power-limit grid step.
        controller: Knob controller to use instead of a fresh ``apply`` one (already entered; the caller restores).
        progress: Called with the steps just simulated.
        use_model_guess: Let the physical prior pick the second setting to visit.
    """
    limits = gpus.knob_limits()
    assert limits is not None
    context = context_of(gpus)
    default = default_setting(gpus)
    knobs = make_knobs(knob, limits, step_w)
    guess = model_guess(gpus.model.spec, cost, context) if use_model_guess else None
    if options is None:  # blocks and warm-ups span the energy counter's updates, as they would on NVML
        period = gpus.config.counter_period_s
        options = TunerOptions(min_block_s=2.0 * period, min_warmup_s=period)
    tuner = PowerTuner(knobs, cost, context, default, options, guess)
    # a controller of the caller's stays theirs to restore; a fresh one restores when tuning ends
    own = controller is None
    journal = KnobJournal(Path(journal_dir) / "knobs-journal.json") if journal_dir is not None else KnobJournal()
    ctl = controller or KnobController("apply", journal, log=lambda _: None)
    with ctl if own else contextlib.nullcontext(ctl):
        applied = GpuSetting(gpus.knob_state().power_limit_w, None)
        if applied != default:
            apply_setting(ctl, [gpus], default, applied)
        applied = default
        total = job_steps if job_steps is not None else max_steps
        while tuner.steps < total and (job_steps is not None or not tuner.holding):
            n = min(tuner.block_steps, total - tuner.steps)
            wanted = tuner.feed(simulate_block(gpus, n))
            if progress is not None:
                progress(n)
            if wanted != applied:
                apply_setting(ctl, [gpus], wanted, applied)
                applied = wanted
        choice = tuner.choice or tuner.current
    return SimulatedTuning(tuner, list(tuner.segments), choice, tuner.profiling_steps or tuner.steps,
                           tuner.steps, default)


def true_figures(gpus: SimulatedGpu | SimulatedGpuGroup, setting: GpuSetting) -> tuple[float, float]:
    """Noise-free ``(job time per sample, energy per sample)`` of ``setting`` from the model."""
    lock = None if setting.sm_clock_mhz is None else (setting.sm_clock_mhz, setting.sm_clock_mhz)
    point = operating_point(gpus.model, KnobState(setting.power_limit_w, lock))
    n = len(_members(gpus))
    return point.time_per_sample_s / n, point.energy_per_sample_j


def true_cost(gpus: SimulatedGpu | SimulatedGpuGroup, setting: GpuSetting, cost: CostMetric) -> float:
    """Noise-free cost per sample of ``setting``; ``inf`` where the metric's constraint rules it out."""
    t, e = true_figures(gpus, setting)
    t0, _ = true_figures(gpus, default_setting(gpus))
    if not cost.feasible(t, t0):
        return float("inf")
    return cost.per_sample(t, e, context_of(gpus))


def candidate_settings(gpus: SimulatedGpu | SimulatedGpuGroup, knob: str, step_w: float = DEFAULT_STEP_W
                       ) -> list[GpuSetting]:
    """Every setting a full sweep of ``knob`` visits (for ``both``: every clock at every limit)."""
    limits = gpus.knob_limits()
    assert limits is not None
    return candidate_grid([k.candidates for k in make_knobs(knob, limits, step_w)], default_setting(gpus))


def oracle(gpus: SimulatedGpu | SimulatedGpuGroup, cost: CostMetric, knob: str = "power-limit",
           step_w: float = DEFAULT_STEP_W) -> tuple[GpuSetting, float]:
    """The best setting of a full noise-free sweep and its cost per sample."""
    costs = {s: true_cost(gpus, s, cost) for s in candidate_settings(gpus, knob, step_w)}
    best = min(costs, key=lambda s: costs[s])
    return best, costs[best]


def summary(run: SimulatedTuning, gpus: SimulatedGpu | SimulatedGpuGroup, cost: CostMetric,
            knob: str = "power-limit", job_steps: int = 10_000, step_w: float = DEFAULT_STEP_W) -> dict[str, Any]:
    """The run against the oracle (over the same grid, ``step_w``), noise-free: choice, cost per sample of both,
    their ratio, and the job's total."""
    best, best_cost = oracle(gpus, cost, knob, step_w)
    chosen_cost = true_cost(gpus, run.choice, cost)
    samples_per_step = len(_members(gpus)) * gpus.model.batch_size
    context = context_of(gpus)

    def spent(setting: GpuSetting) -> float:  # what a step costs, allowed or not (a too-slow step still costs)
        return cost.per_sample(*true_figures(gpus, setting), context)

    profile_cost = sum(spent(seg.setting) * seg.steps for seg in run.segments if seg.phase != "hold") \
        * samples_per_step
    profiled = sum(seg.steps for seg in run.segments if seg.phase != "hold")
    rest = max(job_steps - profiled, 0) * samples_per_step * spent(run.choice)
    default_cost = true_cost(gpus, run.default, cost)
    return {"choice": run.choice.as_dict(), "oracle": best.as_dict(), "choice_cost": chosen_cost,
            "oracle_cost": best_cost, "cost_ratio": chosen_cost / best_cost,
            "profiling_steps": run.profiling_steps, "job_cost": profile_cost + rest,
            "default_job_cost": default_cost * job_steps * samples_per_step,
            "oracle_job_cost": best_cost * job_steps * samples_per_step}
