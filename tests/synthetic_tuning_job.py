"""A made-up job for the power tuner's tests (no simulator): its time and power at each power limit, blocks of it
with seeded noise and a settling overshoot after each change, and tuners to feed it."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dtpo.tune.cost import CostContext, CostMetric, Energy, MaxSlowdown
from dtpo.tune.knob import Knob, power_limit_between
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, SettingStats
from dtpo.tune.tuner import PowerTuner, TunerOptions

# A made-up job on a 300 W GPU: seconds per step and settled board power at each power limit. Energy per step
# (J): 300 W 50.0, 275 W 50.0, 250 W 48.5, 225 W 44.3, 200 W 40.9, 175 W 40.0 (the least), 150 W 42.2,
# 125 W 45.0, 100 W 50.0.
STEP_S = {300.0: 0.200, 275.0: 0.200, 250.0: 0.202, 225.0: 0.206, 200.0: 0.215, 175.0: 0.235, 150.0: 0.285,
          125.0: 0.360, 100.0: 0.500}
POWER_W = {300.0: 250.0, 275.0: 250.0, 250.0: 240.0, 225.0: 215.0, 200.0: 190.0, 175.0: 170.0, 150.0: 148.0,
           125.0: 125.0, 100.0: 100.0}
LIMITS = sorted(STEP_S, reverse=True)
DEFAULT = GpuSetting(300.0)
BEST = GpuSetting(175.0)
BATCH = 32
CONTEXT = CostContext(gpus=1, max_power_w=300.0)


def by_limit(base: GpuSetting) -> list[GpuSetting]:
    """The power-limit knob: the setting chosen so far first, then the rest of the grid from the top."""
    return [base, *(GpuSetting(limit) for limit in LIMITS if limit != base.power_limit_w)]


def on_grid(values: dict[float, float], limit: float) -> float:
    """``values`` at ``limit``, linear between the grid's limits (a limit off the grid, as a refined search picks)."""
    grid = sorted(values)
    return float(np.interp(limit, grid, [values[g] for g in grid]))


class SyntheticJob:
    """Blocks of the made-up job at whatever setting the tuner asks for.

    After each change the power overshoots its settled level and decays back:
    ``power = level * (1 + overshoot * exp(-t / tau))`` with ``t`` seconds since the change (the energy of a
    block is that integrated over the block). Time and level carry seeded relative noise ``noise`` per step.
    ``scale`` multiplies the power (a job that drifts).
    """

    def __init__(self, overshoot: float = 0.0, tau_s: float = 0.3, noise: float = 0.01, seed: int = 0) -> None:
        self.overshoot, self.tau_s, self.noise = overshoot, tau_s, noise
        self.rng = np.random.default_rng(seed)
        self.scale = 1.0
        self.setting: GpuSetting | None = None
        self.since_s = 0.0

    def block(self, setting: GpuSetting, steps: int) -> Block:
        if setting != self.setting:
            self.setting, self.since_s = setting, 0.0
        limit = setting.power_limit_w
        spread = self.noise / math.sqrt(steps)
        time_s = on_grid(STEP_S, limit) * steps * (1.0 + spread * self.rng.standard_normal())
        level = on_grid(POWER_W, limit) * self.scale * (1.0 + spread * self.rng.standard_normal())
        t0, t1 = self.since_s, self.since_s + time_s
        excess = self.overshoot * self.tau_s * (math.exp(-t0 / self.tau_s) - math.exp(-t1 / self.tau_s))
        self.since_s = t1
        return Block(steps, steps * BATCH, time_s, level * (time_s + excess))

    def stats(self, setting: GpuSetting, blocks: int = 10) -> SettingStats:
        """Measured figures of ``setting`` as a saved profile holds them."""
        return SettingStats(setting, [self.block(setting, 1) for _ in range(blocks)])


def make_tuner(metric: CostMetric | None = None, options: TunerOptions | None = None) -> PowerTuner:
    return PowerTuner([by_limit], metric or Energy(), CONTEXT, DEFAULT, options)


def run_until_hold(tuner: PowerTuner, job: SyntheticJob, max_steps: int = 2_000,
                   each: Callable[[PowerTuner], None] | None = None) -> list[str]:
    """Feed blocks until the tuner holds; the phase after each block."""
    phases = []
    while not tuner.holding:
        assert tuner.steps < max_steps, "the tuner never held a choice"
        tuner.feed(job.block(tuner.current, tuner.block_steps))
        phases.append(tuner.phase.value)
        if each is not None:
            each(tuner)
    return phases


def collapse(values: list[str]) -> list[str]:
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def slowdown_tuner(factor: float, options: TunerOptions | None = None, between: bool = True) -> PowerTuner:
    """A tuner for ``MaxSlowdown(factor)`` whose power-limit knob can (or cannot) name limits between its grid's."""
    knob = Knob("power-limit", by_limit, between=power_limit_between if between else None)
    return PowerTuner([knob], MaxSlowdown(factor), CONTEXT, DEFAULT, options)
