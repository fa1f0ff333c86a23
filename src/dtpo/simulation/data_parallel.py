"""A synchronous data-parallel training job on simulated GPUs, in simulated time.

Each step every GPU computes its micro-batch (time and power from its model, with noise and an optional
straggler); the step ends when the slowest GPU is done, and the others wait at idle power
(:func:`synchronous_steps`, which the power tuner's simulation steps too). Knobs are set through the same
:class:`dtpo.devices.knobs.KnobController` as on real GPUs, so the journal and restore paths run for real; energy
is read from the simulated GPUs' counters, which update only every counter period, exactly as a monitor would
read NVML.

Not modelled here (yet): gradient communication time and its power, host-side data loading; the step time
is the slowest GPU's compute time. Say so wherever results are shown.

The job's GPUs are one :class:`dtpo.devices.simulated.SimulatedGpuGroup`: one knob-state file under
``state_dir()/sim`` (present only while the settings differ from the defaults) and one journal entry however
many GPUs there are; its stragglers are slow throughout (the ``static`` pattern). Steps are simulated in chunks
of at most :data:`CHUNK_ELEMENTS` GPU-steps, so memory stays bounded, and a progress callback can follow a long
job. :data:`~dtpo.simulation.job.MAX_GPUS`, :data:`~dtpo.simulation.job.MAX_STEPS` and :data:`MAX_GPU_STEPS`
bound a job; the message of a larger one names the maximum.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.devices.journal import KnobJournal, state_dir
from dtpo.devices.knobs import KnobController
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuGroup
from dtpo.simulation.job import JobConfig, Progress

SWEEPS: tuple[str, ...] = ("power-limit", "sm-clock")
MAX_GPU_STEPS = 500_000_000  # gpus x steps per setting: about a minute per setting on one core
CHUNK_ELEMENTS = 1 << 22  # GPU-steps simulated at once (a few arrays of this many floats: ~32 MB each)


def check_job(config: JobConfig) -> None:
    """Raise :class:`ConfigError` for a job this simulation cannot run (beyond :meth:`JobConfig.validate`)."""
    config.validate()
    if config.gpus * config.steps > MAX_GPU_STEPS:
        raise ConfigError(f"--gpus x --steps must be at most {MAX_GPU_STEPS:,} GPU-steps per setting, got "
                          f"{config.gpus:,} x {config.steps:,}; fewer steps give the same averages")
    if config.stragglers and config.pattern != "static":
        raise ConfigError(f"the {config.pattern} straggler pattern needs the straggler simulation "
                          "(dtpo simulate --tune stragglers); this job's stragglers are slow throughout")


@dataclass(frozen=True)
class StepBlock:
    """What a block of synchronous steps took.

    Attributes:
        step_s: Each step's time: the slowest GPU's compute time.
        wait_s: GPU-seconds spent waiting for the slowest GPU, all GPUs together.
        compute_s: GPU-seconds spent computing, all GPUs together.
    """

    step_s: np.ndarray
    wait_s: float
    compute_s: float


def synchronous_steps(gpus: Sequence[SimulatedGpu], steps: int) -> StepBlock:
    """Run ``steps`` synchronous data-parallel steps on ``gpus`` at their current settings: every GPU computes,
    the step ends when the slowest is done, the others wait at idle power."""
    drawn = [gpu.sample_steps(steps) for gpu in gpus]
    compute = np.stack([times for times, _ in drawn])
    step_s = compute.max(axis=0)
    wait = step_s[None, :] - compute
    for gpu, (_, powers), mine, waited in zip(gpus, drawn, compute, wait, strict=True):
        gpu.advance(mine, powers, waited)
    return StepBlock(step_s, float(wait.sum()), float(compute.sum()))


@dataclass(frozen=True)
class SettingResult:
    """What one knob setting did to the whole job.

    Attributes:
        power_limit_w: Power limit in force on every GPU.
        sm_clock_mhz: Locked SM clock, or ``None`` when clocks float.
        effective_clock_mhz: The clock the (non-straggler) GPUs settled at.
        time_s: Simulated wall time of the job.
        energy_j: Energy of all GPUs, read from their counters.
        samples: Samples trained.
        sync_wait_share: Fraction of GPU-time spent waiting for the slowest GPU.
        gpus: GPUs of the job.
    """

    power_limit_w: float
    sm_clock_mhz: int | None
    effective_clock_mhz: float
    time_s: float
    energy_j: float
    samples: int
    sync_wait_share: float
    gpus: int

    @property
    def average_power_w(self) -> float:
        """Mean power per GPU."""
        return self.energy_j / self.time_s / self.gpus if self.time_s > 0 else 0.0

    @property
    def joules_per_sample(self) -> float:
        """Energy per trained sample."""
        return self.energy_j / self.samples

    @property
    def samples_per_s(self) -> float:
        """Throughput of the whole job."""
        return self.samples / self.time_s

    def as_dict(self) -> dict[str, float | int | None]:
        """Plain values for JSON."""
        return {"power_limit_w": self.power_limit_w, "sm_clock_mhz": self.sm_clock_mhz,
                "effective_clock_mhz": self.effective_clock_mhz, "time_s": self.time_s,
                "energy_j": self.energy_j, "average_power_w": self.average_power_w,
                "joules_per_sample": self.joules_per_sample, "samples_per_s": self.samples_per_s,
                "samples": self.samples, "sync_wait_share": self.sync_wait_share}


class SimulatedJob:
    """A data-parallel job on ``config.gpus`` simulated GPUs, all at one setting; use as a context manager.

    Args:
        config: The job.
        controller: Changes knobs (default: ``apply`` mode on the machine's journal, logging nothing).
        state_folder: Where the GPUs' shared state file lives (default: ``state_dir()/sim``; the file survives
            a crash so the journal can restore the GPUs, and goes when they are back at their defaults).
    """

    def __init__(self, config: JobConfig, controller: KnobController | None = None,
                 state_folder: Path | None = None) -> None:
        check_job(config)
        self.config = config
        self.controller = controller or KnobController("apply", KnobJournal(), log=lambda _: None)
        self.state_folder = state_folder or state_dir() / "sim"
        self._own_folder = state_folder is None
        self.gpus = SimulatedGpuGroup(config.gpu_config(), config.gpus,
                                      self.state_folder / f"{os.getpid()}-{secrets.token_hex(4)}.json",
                                      dict(config.stragglers))
        self.devices: list[SimulatedGpu] = self.gpus.members
        self.model = self.gpus.model

    @property
    def state_path(self) -> Path:
        """The GPUs' shared knob-state file (it exists only while their settings differ from the defaults)."""
        return self.gpus.state_path

    def __enter__(self) -> SimulatedJob:
        self.controller.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.controller.__exit__(*exc)
        finally:
            self.close()

    def close(self) -> None:
        """Delete the state file unless the journal still needs it to restore the GPUs."""
        journaled = self.controller.mode == "apply" and self.gpus.knob_key in self.controller.journal.entries()
        if not journaled:
            self.gpus.forget_state_file()
        try:
            if self._own_folder:
                self.state_folder.rmdir()
        except OSError:
            pass  # another job's file (or one the journal still needs) is in it, or it is already gone

    def run(self, power_limit_w: float | None = None, sm_clock_mhz: int | None = None,
            progress: Progress | None = None) -> SettingResult:
        """Set the knobs on every GPU (``None``: the default limit, clocks unlocked), then run the job.

        Args:
            power_limit_w: Power limit on every GPU.
            sm_clock_mhz: SM clock lock on every GPU.
            progress: Called with the number of steps simulated after each chunk.
        """
        spec = self.model.spec
        limit = spec.max_power_w if power_limit_w is None else power_limit_w
        lock = None if sm_clock_mhz is None else (sm_clock_mhz, sm_clock_mhz)
        state = self.gpus.knob_state()
        if state.power_limit_w != limit:
            self.controller.set_power_limit(self.gpus, limit)
        if state.locked_sm_clocks_mhz != lock:
            if sm_clock_mhz is None:
                self.controller.unlock_sm_clocks(self.gpus)
            else:
                self.controller.lock_sm_clock(self.gpus, sm_clock_mhz)
        self.gpus.knob_state()  # what the controller left (in dry-run and observe mode: unchanged)
        before = [d.energy_j() for d in self.devices]
        time_s = wait_s = compute_s = 0.0
        chunk = max(1, CHUNK_ELEMENTS // self.config.gpus)
        done = 0
        while done < self.config.steps:
            steps = min(chunk, self.config.steps - done)
            block = synchronous_steps(self.devices, steps)
            time_s += float(block.step_s.sum())
            wait_s += block.wait_s
            compute_s += block.compute_s
            done += steps
            if progress is not None:
                progress(steps)
        energy = sum(d.energy_j() - b for d, b in zip(self.devices, before, strict=True))
        fast = [d for d in self.devices if d.config.slowdown == 1.0] or self.devices
        return SettingResult(
            power_limit_w=limit, sm_clock_mhz=sm_clock_mhz,
            effective_clock_mhz=fast[0].operating_point().sm_clock_mhz, time_s=time_s,
            energy_j=float(energy), samples=self.config.steps * self.config.gpus * self.model.batch_size,
            sync_wait_share=wait_s / (wait_s + compute_s), gpus=self.config.gpus)

    def sweep(self, which: str, values: Sequence[float] | None = None, power_limit_w: float | None = None,
              sm_clock_mhz: int | None = None, progress: Progress | None = None) -> list[SettingResult]:
        """Run the job at every value of one knob (``"power-limit"`` or ``"sm-clock"``), the other held fixed.

        Args:
            which: The knob to sweep.
            values: Its values (default: :func:`sweep_values`).
            power_limit_w: The limit held while sweeping clocks (default: the maximum).
            sm_clock_mhz: The clock lock held while sweeping limits (default: none).
            progress: Called with the number of steps simulated after each chunk.
        """
        if values is None:
            values = sweep_values(self.gpus, which)
        if which == "power-limit":
            return [self.run(float(value), sm_clock_mhz, progress) for value in values]
        return [self.run(power_limit_w, int(value), progress) for value in values]


def sweep_values(device: SimulatedGpu | SimulatedGpuGroup, which: str, points: int = 13) -> list[float]:
    """Default sweep: power limits from min to max in even steps, or ``points`` supported SM clocks."""
    limits = device.knob_limits()
    assert limits is not None
    if which == "power-limit":
        low, high = limits.min_power_limit_w, limits.max_power_limit_w
        step = 25.0 if high - low <= 400 else 50.0
        values = list(np.arange(high, low - 1e-9, -step))[::-1]
        if values[0] > low:
            values.insert(0, low)
        return [float(v) for v in values]
    if which == "sm-clock":
        clocks = limits.sm_clocks_mhz
        picks = np.unique(np.linspace(0, len(clocks) - 1, min(points, len(clocks))).round().astype(int))
        return [float(clocks[i]) for i in picks]
    raise ConfigError(f"unknown sweep {which!r} (choose from: {', '.join(SWEEPS)})")


def optimal(results: Sequence[SettingResult]) -> tuple[SettingResult, SettingResult]:
    """The energy-optimal (least J/sample) and time-optimal (most samples/s) settings."""
    return (min(results, key=lambda r: r.joules_per_sample), max(results, key=lambda r: r.samples_per_s))
