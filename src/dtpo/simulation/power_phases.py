"""Simulated data-parallel jobs with the power phases of a real step, and the power timeline a sampler would see.

Each step every GPU computes near its power limit (time and power from its model, with noise and straggler
slowdown, drawn by the GPU itself: :meth:`dtpo.devices.simulated.SimulatedGpu.sample_steps`); the ranks that finish
first wait for the slowest at idle power; then all of them communicate together for the step's all-reduce, at a
power between idle and computing. So every GPU's power is a piecewise-constant signal known exactly, and:

* :meth:`PhasedRun.energy_at` gives each GPU's true cumulative energy at any time;
* :meth:`PhasedRun.sampled` what a sampler reading an energy counter every ``1 / sample_hz`` seconds records (mean
  power over each interval; the counter optionally updating only every ``counter_period_s``, like NVML's);
* :meth:`PhasedRun.write_run` a run directory (``record.json`` with the step marks and each rank's energy, and
  ``ranks/power-rankNNNNN.csv``) that ``dtpo report`` and ``dtpo report --power-swing`` read like a train run's,
  every figure labelled simulated.

The communication time and power are parameters (:class:`StepPhases`), not a network model: the step's all-reduce
is not overlapped with backward here. A power floor (:attr:`StepPhases.floor_share`, what GB200's power smoothing
holds) keeps every phase at or above that share of the power limit; the ramp limits of power smoothing are not
simulated (the phases stay piecewise constant). Knobs stay at the GPUs' defaults unless a power limit is given,
set through the job's journaled :class:`~dtpo.devices.knobs.KnobController`.
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.core.record_sections import KnobSection
from dtpo.core.totals import compute_totals, energy_totals
from dtpo.simulation.data_parallel import SimulatedJob
from dtpo.simulation.job import JobConfig
from dtpo.telemetry.trace import TIMELINE_START, power_timeline_path

MAX_PHASED_STEPS = 100_000
MAX_SAMPLES = 50_000_000  # ranks x samples of a sampled timeline (float64: 400 MB)


@dataclass(frozen=True)
class StepPhases:
    """How a step's communication looks on the power meter.

    Attributes:
        comm_share: Communication time per step, as a share of the model's compute time per step.
        comm_power_share: Power while communicating: idle power plus this share of (compute power - idle).
        sample_hz: The sampler's rate (what :meth:`PhasedRun.sampled` and :meth:`PhasedRun.write_run` use).
        counter_period_s: The energy counter updates only every this many seconds (0: continuously).
        floor_share: Power smoothing's floor, as a share of the power limit: no phase draws less (0: no floor).
    """

    comm_share: float = 0.25
    comm_power_share: float = 0.3
    sample_hz: float = 50.0
    counter_period_s: float = 0.0
    floor_share: float = 0.0

    def validate(self) -> None:
        """Raise a one-line :class:`ConfigError` for values no job could have."""
        if not math.isfinite(self.comm_share) or self.comm_share < 0:
            raise ConfigError(f"communication share must be a finite number >= 0, got {self.comm_share:g}")
        if not math.isfinite(self.comm_power_share) or not 0 <= self.comm_power_share <= 1:
            raise ConfigError(f"communication power share must be between 0 and 1, got {self.comm_power_share:g}")
        if not math.isfinite(self.sample_hz) or not 0 < self.sample_hz <= 10_000:
            raise ConfigError(f"sample rate must be between 0 and 10,000 Hz, got {self.sample_hz:g}")
        if not math.isfinite(self.counter_period_s) or self.counter_period_s < 0:
            raise ConfigError(f"counter period must be a finite number >= 0 s, got {self.counter_period_s:g}")
        if not math.isfinite(self.floor_share) or not 0 <= self.floor_share <= 1:
            raise ConfigError(f"power floor must be a share of the power limit between 0 and 1, got "
                              f"{self.floor_share:g}")


@dataclass(frozen=True)
class PhasedRun:
    """The phases of every step on every GPU of a simulated job, in simulated seconds from 0.

    Attributes:
        config: The job.
        phases: Its communication phases and sampling.
        step_start_s: Each step's start, and the end of the last step (steps + 1 values; all ranks share them).
        compute_s: Compute time per rank and step.
        compute_w: Power while computing, per rank and step.
        comm_s: Communication time per step.
        comm_w: Power while communicating.
        idle_w: Power while waiting for the slowest rank.
        limit_w: The power limit in force on every GPU.
        device: The name of a GPU's device (rank ``r`` is ``sim{r} ...``).
        detail: The model behind the GPUs, in words.
    """

    config: JobConfig
    phases: StepPhases
    step_start_s: np.ndarray
    compute_s: np.ndarray
    compute_w: np.ndarray
    comm_s: np.ndarray
    comm_w: float
    idle_w: float
    limit_w: float
    device: str
    detail: str

    @property
    def ranks(self) -> int:
        """GPUs of the job."""
        return int(self.compute_s.shape[0])

    @property
    def steps(self) -> int:
        """Steps simulated."""
        return int(self.compute_s.shape[1])

    @property
    def duration_s(self) -> float:
        """Simulated time of the whole job."""
        return float(self.step_start_s[-1])

    @property
    def wait_s(self) -> np.ndarray:
        """Time each rank waits for the slowest, per step."""
        return self.compute_s.max(axis=0)[None, :] - self.compute_s

    def segments(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s phase boundaries (compute, wait, communicate in each step) and its true cumulative
        energy at each: two arrays of ``3 x steps + 1`` values."""
        start = self.step_start_s[:-1]
        compute = self.compute_s[rank]
        ready = start + compute
        comm_from = start + self.compute_s.max(axis=0)
        times = np.empty(3 * self.steps + 1)
        times[0] = 0.0
        times[1::3], times[2::3], times[3::3] = ready, comm_from, self.step_start_s[1:]
        joules = np.stack([compute * self.compute_w[rank], (comm_from - ready) * self.idle_w,
                           self.comm_s * self.comm_w], axis=1).ravel()
        return times, np.concatenate([[0.0], np.cumsum(joules)])

    def energy_at(self, t_s: np.ndarray, ranks: range | None = None, summed: bool = False) -> np.ndarray:
        """True cumulative energy of each rank (one row per rank) or of their sum at times ``t_s``."""
        t = np.asarray(t_s, dtype=float)
        chosen = ranks if ranks is not None else range(self.ranks)
        if summed:
            total = np.zeros(t.size)
            for r in chosen:
                total += np.interp(t, *self.segments(r))
            return total
        return np.vstack([np.interp(t, *self.segments(r)) for r in chosen])

    def mean_power(self, edges_s: np.ndarray, ranks: range | None = None, summed: bool = False) -> np.ndarray:
        """Exact mean power over each interval between consecutive ``edges_s`` (per rank, or summed)."""
        edges = np.asarray(edges_s, dtype=float)
        return np.diff(self.energy_at(edges, ranks, summed), axis=-1) / np.diff(edges)

    def sample_times(self) -> np.ndarray:
        """When the sampler reads the counters: every ``1 / sample_hz`` from the start to the job's end."""
        interval = 1.0 / self.phases.sample_hz
        return interval * np.arange(int(math.floor(self.duration_s / interval + 1e-9)) + 1)

    def sampled(self, ranks: range | None = None) -> tuple[np.ndarray, np.ndarray]:
        """What a sampler records: times of its readings after the first, and each rank's mean power since the
        previous reading, from the counter as it stood (a counter with a period shows the energy at its latest
        update).

        Raises:
            ConfigError: The timeline would hold more than :data:`MAX_SAMPLES` values.
        """
        t = self.sample_times()
        chosen = ranks if ranks is not None else range(self.ranks)
        if len(chosen) * t.size > MAX_SAMPLES:
            raise ConfigError(f"a sampled timeline of {len(chosen):,} GPUs x {t.size:,} samples is too large "
                              f"(at most {MAX_SAMPLES:,} values); lower the sample rate or the steps")
        period = self.phases.counter_period_s
        read_at = np.floor(t / period + 1e-9) * period if period > 0 else t
        energy = self.energy_at(read_at, chosen)
        return t[1:], np.diff(energy, axis=1) / np.diff(t)

    def gaps(self, rank: int = 0) -> list[tuple[float, float]]:
        """Rank ``rank``'s communication gaps: from its compute's end (waiting, then communicating) to the step's
        end, in simulated seconds."""
        start = self.step_start_s[:-1]
        return list(zip((start + self.compute_s[rank]).tolist(), self.step_start_s[1:].tolist(), strict=True))

    def rank_record(self, rank: int, base_unix_s: float, timeline_start_s: float) -> RankRecord:
        """Rank ``rank`` as a run record holds it: its steps (marks on the Unix clock from ``base_unix_s``), its
        GPU and its energy over the job (simulated), its power limit."""
        batch = self.config.batch_size or self.model_batch
        wait = self.wait_s[rank]
        steps = [StepRecord(step=i, warmup=False, samples=batch, step_s=float(self.step_start_s[i + 1]
                                                                             - self.step_start_s[i]),
                            data_wait_s=0.0, compute_s=float(self.compute_s[rank, i]),
                            tail_s=float(wait[i] + self.comm_s[i]), optimizer_s=0.0,
                            comm_exposed_s=float(self.comm_s[i]), sync_wait_s=float(wait[i]),
                            started_at=base_unix_s + float(self.step_start_s[i])) for i in range(self.steps)]
        name = self.device_name(rank)
        joules = float(self.segments(rank)[1][-1])
        run = {"name": "run", "time_s": self.duration_s, "energy_j": {name: joules}, "total_j": joules,
               "sources": {name: "simulated"}, "estimated": True, "lost": []}
        device = {"name": name, "kind": "gpu", "source": "simulated", "estimated": True, "node_shared": False,
                  "detail": self.detail}
        return RankRecord(rank=rank, local_rank=rank % 8, node=f"sim-node{rank // 8}", device=name, steps=steps,
                          energy={"devices": [device], "notes": ["simulated GPU: every figure simulated"],
                                  "estimated": True, "windows": [], "run": run, "lost": {},
                                  TIMELINE_START: base_unix_s + timeline_start_s},
                          knobs=KnobSection(power_limit_w=self.limit_w, applied=True, mode="apply",
                                            gpus=[name], note="simulated GPUs"))

    @property
    def model_batch(self) -> int:
        """Samples per step on one GPU."""
        return self.config.model().batch_size

    def device_name(self, rank: int) -> str:
        """Rank ``rank``'s GPU as its device column names it."""
        return f"sim{rank} ({self.device})"

    def write_run(self, run_dir: Path, run_id: str | None = None) -> Path:
        """Write the job as a run directory that ``dtpo report`` reads: ``record.json`` and every rank's
        sampled power timeline. Returns the run directory.

        Raises:
            ConfigError: ``run_dir`` already holds a record, or cannot be written.
        """
        run_dir = Path(run_dir)
        if (run_dir / "record.json").exists():
            raise ConfigError(f"{run_dir} already holds a run record")
        base = _dt.datetime.now(_dt.UTC).timestamp()
        t, watts = self.sampled()
        try:
            ranks = []
            for rank in range(self.ranks):
                ranks.append(self.rank_record(rank, base, float(t[0])))
                write_timeline(power_timeline_path(run_dir, rank), t, {self.device_name(rank): watts[rank]})
            settings = {"grid_g_per_kwh": 475.0}
            record = RunRecord(
                run_id=run_id or run_dir.name, status="completed",
                started_at=_dt.datetime.fromtimestamp(base, _dt.UTC).isoformat(timespec="seconds"),
                finished_at=_dt.datetime.fromtimestamp(base + self.duration_s, _dt.UTC).isoformat(timespec="seconds"),
                config={"simulated": {"job": asdict(self.config), "phases": asdict(self.phases)}, "energy": settings},
                environment={"simulated": True, "note": "a simulated job: no process trained anything"},
                ranks=ranks)
            record.totals = compute_totals(record.ranks)
            record.energy = energy_totals(record.ranks, settings)
            record.save(run_dir)
        except OSError as exc:
            raise ConfigError(f"cannot write the simulated run {run_dir} ({exc.strerror or exc})") from None
        return run_dir


def write_timeline(path: Path, t_s: np.ndarray, watts: dict[str, np.ndarray]) -> None:
    """Write a power timeline in the format of a train run's (``t_s`` from the first sample, then watts per device
    in ``NAME [W]`` columns), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    names = sorted(watts)
    with tmp.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["t_s", *[f"{n} [W]" for n in names]])
        columns = [watts[n] for n in names]
        for i, t in enumerate(t_s):
            writer.writerow([f"{t - t_s[0]:.4f}", *[f"{c[i]:.3f}" for c in columns]])
    os.replace(tmp, path)


def simulate_phases(config: JobConfig, phases: StepPhases | None = None, power_limit_w: float | None = None,
                    state_folder: Path | None = None) -> PhasedRun:
    """Run ``config`` with step phases: every GPU draws its compute times and powers itself, waits for the slowest
    at idle power, then communicates.

    Args:
        config: The job (its ``steps`` at most :data:`MAX_PHASED_STEPS`).
        phases: Communication and sampling (default :class:`StepPhases`).
        power_limit_w: Power limit on every GPU (default: the GPU's maximum), set through the journaled controller.
        state_folder: Where the GPUs' knob-state file goes while a limit is set (default: the machine's).

    Raises:
        ConfigError: A bad job, phases or limit (one line).
    """
    phases = phases or StepPhases()
    phases.validate()
    if config.steps > MAX_PHASED_STEPS:
        raise ConfigError(f"a phased simulation runs at most {MAX_PHASED_STEPS:,} steps, got {config.steps:,}")
    with SimulatedJob(config, state_folder=state_folder) as job:
        spec = job.model.spec
        if power_limit_w is not None and power_limit_w != spec.max_power_w:
            job.controller.set_power_limit(job.gpus, power_limit_w)
            job.gpus.knob_state()
        drawn = [gpu.sample_steps(config.steps) for gpu in job.devices]
        point = job.devices[0].operating_point()
        limit = job.gpus.knob_state().power_limit_w
        detail = job.devices[0].info.detail
        device = f"{spec.name}, {job.model.workload}"
        if power_limit_w is not None and power_limit_w != spec.max_power_w:
            job.controller.set_power_limit(job.gpus, spec.max_power_w)
    compute = np.stack([times for times, _ in drawn])
    power = np.stack([watts for _, watts in drawn])
    nominal = point.time_per_sample_s * job.model.batch_size
    rng = np.random.default_rng([config.seed, config.gpus, 0xC0])
    comm = phases.comm_share * nominal * np.maximum(0.05, 1.0 + config.noise * rng.standard_normal(config.steps))
    step = compute.max(axis=0) + comm
    comm_w = point.idle_power_w + phases.comm_power_share * (point.power_w - point.idle_power_w)
    floor_w = phases.floor_share * float(limit)
    floor = f", a power floor of {100 * phases.floor_share:g} % of the limit" if floor_w > 0 else ""
    return PhasedRun(config=config, phases=phases, step_start_s=np.concatenate([[0.0], np.cumsum(step)]),
                     compute_s=compute, compute_w=np.maximum(power, floor_w), comm_s=comm,
                     comm_w=max(float(comm_w), floor_w), idle_w=max(float(point.idle_power_w), floor_w),
                     limit_w=float(limit), device=device,
                     detail=f"simulated GPU with step phases (communication {100 * phases.comm_share:g} % of compute "
                            f"time at idle + {100 * phases.comm_power_share:g} % of the swing{floor}); {detail}")
