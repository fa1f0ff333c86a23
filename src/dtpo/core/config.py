"""The configuration tree of a run, passed as data from the CLI to every worker and into the record.

One tree, nested keyword-only dataclasses::

    RunConfig
      workload  WorkloadConfig   which built-in workload, steps, batch, learning rate, seed
      session   SessionConfig    precision, strategy, accumulation, compression, warm-up, windows
      energy    EnergyConfig     measure or not, CPU TDP, grid intensity, price
      knobs     KnobConfig       GPU power limit / SM clock held for the run, apply | dry-run | observe
      tune      TuneConfig       GPU knob tuned while training, the cost metric, saved profiles
      launch    LaunchConfig     local workers, threads per worker, run directory, restarts
      telemetry TelemetryConfig  run store, live metrics, traces, report
      checkpoint CheckpointConfig checkpoints and resuming from them (:mod:`dtpo.core.checkpoint_config`)
      grid      GridConfig       a grid signal the power limit follows (:mod:`dtpo.core.grid_config`)

Every field carries its documentation as a string right under it (read by :func:`field_docs`, so the CLI's
help and this file cannot disagree) and, where it is a command-line flag, the flag's name in its metadata
(:func:`flag`). Values are checked in ``__post_init__``; a bad one raises :class:`ConfigError` naming the
field and its flag: ``session.grad_accum must be >= 1, got 0 (--grad-accum)``.

The CLI writes the resolved tree to ``RUN_DIR/config.json``; workers read it from there (``DTPO_CONFIG``),
the record keeps it, and ``dtpo train --config RUN_DIR/config.json`` (or a TOML file) runs it again.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from dtpo.core.checkpoint_config import CheckpointConfig
from dtpo.core.config_section import ConfigField, Section, Tree, flag, tree_fields
from dtpo.core.config_section import field_docs as field_docs  # re-exported: the sections' documentation
from dtpo.core.errors import ConfigError
from dtpo.core.frameworks import FRAMEWORKS
from dtpo.core.grid_config import GridConfig
from dtpo.core.power_smoothing import SmoothingRequest, parse_power_smoothing
from dtpo.core.record import write_json_atomic

CONFIG_SCHEMA = "dtpo.config/1"
CONFIG_FILE = "config.json"

PRECISIONS: tuple[str, ...] = ("32-true", "bf16-mixed", "16-mixed")
STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")
COMPRESSIONS: tuple[str, ...] = ("none", "fp16", "bf16", "powersgd")
KNOB_MODES: tuple[str, ...] = ("apply", "dry-run", "observe")
BACKENDS: tuple[str, ...] = ("gloo", "nccl")
TUNE_KNOBS: tuple[str, ...] = ("power-limit", "sm-clock", "both")  # the GPU knobs the power tuner searches
REBALANCE_BOTH = "rebalance,stragglers"  # uneven batches for what persists, slower clocks for the rest
# stragglers: each waiting rank slows its own GPU; rebalance: each rank's share of the global batch follows its speed
TUNE_CHOICES: tuple[str, ...] = (*TUNE_KNOBS, "stragglers", "rebalance", REBALANCE_BOTH)
JOB_KNOBS: tuple[str, ...] = ("precision", "grad-accum", "compression")  # job knobs, tuned in this order

MAX_STEPS = 10**9
MAX_BATCH_SIZE = 2**20
MAX_GRAD_ACCUM = 4096
MAX_WORKERS = 1024
ENGINES = ("torchrun", "ray")
MAX_SEED = 2**63 - 1
MAX_RESTARTS = 1000
MAX_SAMPLE_HZ = 1000.0  # the fastest power source (RAPL) updates about every millisecond
STALL_FACTOR = 20.0
"""A rank stalls after this many median step times without progress (the launcher's default)."""
STALL_FLOOR_S = 300.0
"""... and never before this many seconds."""
MIN_STALL_FLOOR_S = 3.0
"""The shortest floor: a rank's heartbeat must be able to miss a few beats before it counts as stopped."""


@dataclass(kw_only=True)
class WorkloadConfig(Section):
    """What to train (the built-in example workloads of ``dtpo train``)."""

    SECTION: ClassVar[str] = "workload"

    name: str = field(default="lm", metadata=flag("--workload", short="-w"))
    """Built-in workload: lm (character-level GPT on Python's own sources), mlp or cnn (synthetic)."""
    steps: int | None = field(default=None, metadata=flag("--steps"))
    """Optimizer steps to train (default: the workload's own)."""
    batch_size: int | None = field(default=None, metadata=flag("--batch-size"))
    """Micro-batch size per worker (default: the workload's own)."""
    lr: float | None = field(default=None, metadata=flag("--lr"))
    """AdamW learning rate (default: the workload's own)."""
    seed: int = field(default=0, metadata=flag("--seed"))
    """Seed of the model's initial weights and of the data."""
    framework: str = field(default="torch", metadata=flag("--framework"))
    """What the workload computes with: torch, jax, tensorflow or keras (on its KERAS_BACKEND); the others train
    the mlp, reported through dtpo.jax / dtpo.tensorflow / dtpo.keras (install their extra)."""

    def __post_init__(self) -> None:
        self._check_type("name", str, False)
        self._choice("framework", FRAMEWORKS)
        self._int("steps", 1, MAX_STEPS, optional=True)
        self._int("batch_size", 1, MAX_BATCH_SIZE, optional=True)
        self._float("lr", positive=True, maximum=1e3, optional=True)
        self._int("seed", 0, MAX_SEED)


@dataclass(kw_only=True)
class SessionConfig(Section):
    """How a :class:`~dtpo.session.session.Session` trains and measures."""

    SECTION: ClassVar[str] = "session"

    precision: str = field(default="32-true", metadata=flag("--precision"))
    """32-true, bf16-mixed (autocast to bfloat16) or 16-mixed (autocast to float16 with a gradient scaler)."""
    strategy: str = field(default="ddp", metadata=flag("--strategy"))
    """ddp (DistributedDataParallel) or fsdp (FSDP2 fully_shard)."""
    grad_accum: int = field(default=1, metadata=flag("--grad-accum"))
    """Micro-batches per optimizer step; gradients are synchronised on the last one only."""
    compression: str = field(default="none", metadata=flag("--compression"))
    """Gradient compression in DDP's comm hook: none, fp16, bf16 (where the backend has it) or powersgd."""
    powersgd_rank: int = field(default=1, metadata=flag("--powersgd-rank"))
    """Rank of PowerSGD's low-rank approximation (1-4), with error feedback."""
    warmup_steps: int = field(default=2, metadata=flag("--warmup-steps"))
    """Optimizer steps left out of the totals (DDP rebuilds its buckets after the first; FLOPs are counted then)."""
    window_steps: int = field(default=10, metadata=flag("--window-steps"))
    """Optimizer steps per measurement window (time, samples and energy; what tuners are fed)."""
    max_grad_norm: float | None = field(default=None, metadata=flag("--max-grad-norm"))
    """Clip gradients to this total norm before each optimizer step."""
    count_flops: bool = field(default=True, metadata=flag("--count-flops"))
    """Count model FLOPs on the first step with torch.utils.flop_counter (for MFU)."""
    flush_every: int = field(default=50, metadata=flag("--flush-every"))
    """Write each rank's partial record every N steps, so a crash leaves what was measured."""

    def __post_init__(self) -> None:
        self._choice("precision", PRECISIONS)
        self._choice("strategy", STRATEGIES)
        self._int("grad_accum", 1, MAX_GRAD_ACCUM)
        self._choice("compression", COMPRESSIONS)
        self._int("powersgd_rank", 1, 4)
        self._int("warmup_steps", 0, MAX_STEPS)
        self._int("window_steps", 1, MAX_STEPS)
        self._float("max_grad_norm", positive=True, optional=True)
        self._bool("count_flops")
        self._int("flush_every", 1, MAX_STEPS)
        if self.strategy == "fsdp" and self.compression != "none":
            raise self._fail("compression", f"must be none with strategy fsdp (FSDP2 has no DDP comm hook), "
                             f"got {self.compression!r}")


@dataclass(kw_only=True)
class EnergyConfig(Section):
    """How a Session measures energy and what it costs."""

    SECTION: ClassVar[str] = "energy"

    enabled: bool = field(default=True, metadata=flag("--energy"))
    """Measure energy: GPUs through NVML, CPUs through RAPL, else a model labelled estimated."""
    sample_interval_s: float | None = field(default=0.1, metadata=flag("--power-sample-interval"))
    """Seconds between samples of the background power timeline (null: no timeline)."""
    sample_hz: float | None = field(default=None, metadata=flag("--power-sample-hz"))
    """Samples per second of the power timeline, instead of --power-sample-interval: up to what the slowest power
    source of a rank supports (NVML GPUs and modelled CPUs 100 Hz, RAPL 1000 Hz)."""
    cpu_tdp_w: float | None = field(default=None, metadata=flag("--cpu-tdp"))
    """TDP in watts of this node's CPUs, for the modelled CPU where no counter exists (default: a table)."""
    grid_g_per_kwh: float = field(default=475.0, metadata=flag("--grid-intensity"))
    """Carbon intensity of the electricity, g CO2e per kWh (default: the world average)."""
    price_per_kwh: float | None = field(default=None, metadata=flag("--price-per-kwh"))
    """Price of a kWh, for the cost figure (no cost without it)."""
    currency: str = field(default="USD", metadata=flag("--currency"))
    """Currency of the price."""

    def __post_init__(self) -> None:
        self._bool("enabled")
        self._float("sample_interval_s", minimum=0.001, maximum=3600.0, optional=True)
        self._float("sample_hz", positive=True, maximum=MAX_SAMPLE_HZ, optional=True)
        if self.sample_hz is not None:
            interval = 1.0 / self.sample_hz
            if self.sample_interval_s not in (None, 0.1) and not math.isclose(self.sample_interval_s, interval):
                raise self._fail("sample_hz", f"and --power-sample-interval {self.sample_interval_s:g} disagree; "
                                              "give one of them")
            self.sample_interval_s = interval
        self._float("cpu_tdp_w", positive=True, maximum=100_000.0, optional=True)
        self._float("grid_g_per_kwh", minimum=0.0, maximum=10_000.0)
        self._float("price_per_kwh", minimum=0.0, maximum=1e6, optional=True)
        self._check_type("currency", str, False)


@dataclass(kw_only=True)
class KnobConfig(Section):
    """GPU knobs held on each rank's GPU for the run and restored at its end (or by the next dtpo start)."""

    SECTION: ClassVar[str] = "knobs"

    power_limit_w: float | None = field(default=None, metadata=flag("--power-limit"))
    """GPU power limit in watts for the run."""
    sm_clock_mhz: int | None = field(default=None, metadata=flag("--sm-clock"))
    """Lock the GPU's SM clocks at this supported frequency (MHz) for the run."""
    power_smoothing: str | None = field(default=None, metadata=flag("--power-smoothing"))
    """NVML power smoothing (GB200 and later; a logged no-op elsewhere): off, or PROFILE[:floor=PCT,ramp_up=W/S,
    ramp_down=W/S,hysteresis=MS], a preset profile 0-4 activated with those of its parameters changed (floor in %
    of the GPU's total module power)."""
    mode: str = field(default="apply", metadata=flag("--knob-mode"))
    """apply (change the GPU; falls back to observe without permission), dry-run (log only) or observe."""

    def __post_init__(self) -> None:
        self._float("power_limit_w", positive=True, maximum=10_000.0, optional=True)
        self._int("sm_clock_mhz", 1, 10_000, optional=True)
        self._choice("mode", KNOB_MODES)
        if self.power_smoothing is not None:
            try:
                parse_power_smoothing(self.power_smoothing)
            except ConfigError as exc:
                raise self._fail("power_smoothing", str(exc)) from None

    @property
    def smoothing(self) -> SmoothingRequest | None:
        """The power smoothing asked for, if any."""
        return None if self.power_smoothing is None else parse_power_smoothing(self.power_smoothing)

    @property
    def requested(self) -> bool:
        """True when any knob is to be set."""
        return self.power_limit_w is not None or self.sm_clock_mhz is not None or self.power_smoothing is not None


@dataclass(kw_only=True)
class TuneConfig(Section):
    """Tuning GPU knobs while the job trains, toward a cost metric (see ``dtpo.tune``)."""

    SECTION: ClassVar[str] = "tune"

    knob: str | None = field(default=None, metadata=flag("--tune"))
    """Tune while training: power-limit, sm-clock or both (toward --cost); stragglers (ranks that only wait
    for the slowest one lock their own SM clock lower); rebalance (each rank's share of the global batch follows
    its speed, for stragglers that persist), or rebalance,stragglers (both); or job knobs, comma-separated:
    precision, grad-accum, compression (toward --cost, numerics guarded); default: no tuning."""
    cost: str = field(default="zeus:0.5", metadata=flag("--cost"))
    """What the tuner minimises: energy, time, zeus:ETA, slowdown:FACTOR or dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR."""
    step_w: float = field(default=25.0, metadata=flag("--tune-step"))
    """Power-limit grid of the tuner, in watts (Zeus's 25 W by default)."""
    profile_dir: str | None = field(default=None, metadata=flag("--profile-dir"))
    """Folder of saved tuning profiles (default: $DTPO_STATE_DIR/profiles)."""
    fresh_profile: bool = field(default=False, metadata=flag("--fresh-profile"))
    """Profile again even when a saved profile of the same job exists."""
    allow_batch_change: bool = field(default=False, metadata=flag("--allow-batch-change"))
    """Let --tune grad-accum change the global batch (more micro-batches of the same size); by default it
    keeps micro-batch x accumulation fixed, which leaves the optimisation unchanged."""
    guard_cosine: float = field(default=0.8, metadata=flag("--guard-cosine"))
    """Convergence guard: a precision or compression is accepted only when its gradient on a probe batch has at
    least this cosine similarity with the exact float32 gradient (error feedback averaged over a few probes)."""
    rebalance_max_share: float = field(default=1.5, metadata=flag("--rebalance-max-share"))
    """--tune rebalance: a rank takes at most this many times the even share of the global batch (its memory
    headroom: a fast rank's batch grows by up to this factor)."""
    guard_loss_rise: float = field(default=0.05, metadata=flag("--guard-loss-rise"))
    """Convergence guard: a setting that changes numerics is rejected when the loss over its profiling steps
    rises by more than this fraction above the loss just before it (beyond the loss's own noise)."""

    @property
    def stragglers(self) -> bool:
        """Whether ranks that only wait lock their own clock lower (``stragglers``, alone or with ``rebalance``)."""
        return self.knob in ("stragglers", REBALANCE_BOTH)

    @property
    def rebalance(self) -> bool:
        """Whether each rank's share of the global batch follows its speed (``rebalance``, alone or with
        ``stragglers``)."""
        return self.knob in ("rebalance", REBALANCE_BOTH)

    @property
    def needs_session(self) -> bool:
        """Whether the tuning needs dtpo.Session's marks and switches (job knobs, stragglers, rebalance), not only
        step ends."""
        return bool(self.job_knobs) or self.stragglers or self.rebalance

    @property
    def job_knobs(self) -> tuple[str, ...]:
        """The job knobs named by ``knob`` (empty for GPU knobs or no tuning)."""
        if self.knob is None or self.knob in TUNE_CHOICES:
            return ()
        return tuple(n for n in JOB_KNOBS if n in {part.strip() for part in self.knob.split(",")})

    def __post_init__(self) -> None:
        if isinstance(self.knob, str) and {part.strip() for part in self.knob.split(",")} == {"rebalance",
                                                                                             "stragglers"}:
            self.knob = REBALANCE_BOTH  # either order, one name
        if self.knob is not None and self.knob not in TUNE_CHOICES:
            self._check_type("knob", str, False)
            names = [part.strip() for part in self.knob.split(",")]
            bad = next((n for n in names if n not in JOB_KNOBS), None)
            if bad in TUNE_CHOICES:
                raise self._fail("knob", f"cannot combine {bad} with job knobs yet ({self.knob!r}): tune the GPU "
                                         "knobs and the job knobs in separate runs")
            if bad is not None:
                raise self._fail("knob", f"unknown knob {bad!r} (choose {', '.join(TUNE_CHOICES)}, or job knobs "
                                         f"separated by commas: {', '.join(JOB_KNOBS)})")
            if len(set(names)) != len(names):
                raise self._fail("knob", f"names a knob twice: {self.knob!r}")
        self._bool("allow_batch_change")
        if self.allow_batch_change and "grad-accum" not in self.job_knobs:
            raise self._fail("allow_batch_change", "is only meaningful with --tune grad-accum (accumulation in the "
                                                   "knob list)")
        self._float("guard_cosine", positive=True, maximum=1.0)
        self._float("guard_loss_rise", positive=True, maximum=10.0)
        self._float("rebalance_max_share", positive=True, maximum=64.0)
        if self.rebalance_max_share < 1.0:
            raise self._fail("rebalance_max_share", f"must be at least 1 (the even share), got "
                                                    f"{self.rebalance_max_share:g}")
        self._check_type("cost", str, False)
        if not self.cost.strip():
            raise self._fail("cost", "must name a cost metric, got an empty string")
        self._float("step_w", positive=True, maximum=1000.0)
        self._check_type("profile_dir", str, True)
        self._bool("fresh_profile")


@dataclass(kw_only=True)
class LaunchConfig(Section):
    """How ``dtpo train`` starts its local workers."""

    SECTION: ClassVar[str] = "launch"

    workers: int = field(default=2, metadata=flag("--workers"))
    """Local worker processes."""
    threads_per_worker: int | None = field(default=None, metadata=flag("--threads-per-worker"))
    """Compute threads of each worker (default: $OMP_NUM_THREADS when set, else the usable cores / workers)."""
    backend: str | None = field(default=None, metadata=flag("--backend"))
    """Collective backend: gloo or nccl (default: nccl on CUDA, else gloo)."""
    run_dir: str | None = field(default=None, metadata=flag("--run-dir"))
    """Directory of the run's record (default: runs/<run-id>)."""
    overwrite: bool = field(default=False, metadata=flag("--overwrite"))
    """Allow a run directory that already holds a record to be written over."""
    engine: str = field(default="torchrun", metadata=flag("--engine"))
    """What starts the workers: torchrun (torch.distributed.run's elastic launcher) or ray (Ray Train's
    TorchTrainer, on a local Ray instance or the cluster at --ray-address)."""
    ray_address: str | None = field(default=None, metadata=flag("--ray-address"))
    """Address of an existing Ray cluster (e.g. ray://head:10001 or head:6379) for --engine ray; default: a
    local Ray instance started for the run."""
    max_restarts: int = field(default=0, metadata=flag("--max-restarts"))
    """Restart the workers up to N times when one fails (torchrun's elastic restarts); with --checkpoint-every
    they resume from the newest complete checkpoint."""
    stall_factor: float = field(default=STALL_FACTOR, metadata=flag("--stall-factor"))
    """Name and stop a rank that makes no progress for N median step times (and at least --stall-floor seconds),
    instead of letting the others wait for the collective's timeout; with --max-restarts the group restarts
    (0: off)."""
    stall_floor: float = field(default=STALL_FLOOR_S, metadata=flag("--stall-floor"))
    """Never count a rank as stalled before this many seconds without progress (raise it when checkpoints or
    evaluations between steps take longer)."""

    def __post_init__(self) -> None:
        self._int("workers", 1, MAX_WORKERS)
        self._int("max_restarts", 0, MAX_RESTARTS)
        self._float("stall_factor", minimum=0.0)
        self._float("stall_floor", minimum=MIN_STALL_FLOOR_S)
        self._choice("engine", ENGINES)
        self._check_type("ray_address", str, True)
        if self.ray_address is not None and (not self.ray_address.strip() or self.engine != "ray"):
            raise self._fail("ray_address", "needs --engine ray and a non-empty address" if self.ray_address.strip()
                             else "must name a Ray cluster address, got an empty string")
        self._int("threads_per_worker", 1, 4096, optional=True)
        if self.backend is not None:
            self._choice("backend", BACKENDS)
        self._check_type("run_dir", str, True)
        if self.run_dir is not None and not self.run_dir.strip():
            raise self._fail("run_dir", "must name a directory, got an empty string")
        self._bool("overwrite")


@dataclass(kw_only=True)
class TelemetryConfig(Section):
    """Where a run shows up besides its record: the run store, live metrics, traces and the HTML report."""

    SECTION: ClassVar[str] = "telemetry"

    store: str | None = field(default=None, metadata=flag("--store"))
    """SQLite run store every run is registered in (default: $DTPO_STORE, else runs/dtpo.sqlite in the working
    directory)."""
    metrics_addr: str | None = field(default=None, metadata=flag("--metrics-addr"))
    """Serve live Prometheus metrics at [HOST:]PORT, one endpoint per node (host default 127.0.0.1; port 0
    picks a free one); default: no endpoint."""
    trace: bool = field(default=True, metadata=flag("--trace"))
    """Write RUN_DIR/trace/rank*.json and merged.json (Chrome trace events: open in Perfetto)."""
    report: bool = field(default=True, metadata=flag("--report"))
    """Write RUN_DIR/report.html (plots of the run, self-contained) when the run ends."""

    def __post_init__(self) -> None:
        self._check_type("store", str, True)
        if self.store is not None and not self.store.strip():
            raise self._fail("store", "must name a file, got an empty string")
        self._check_type("metrics_addr", str, True)
        if self.metrics_addr is not None:
            parse_metrics_addr(self.metrics_addr)
        self._bool("trace")
        self._bool("report")


def parse_metrics_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` as (host, port); the host defaults to 127.0.0.1.

    Raises:
        ConfigError: Not an address with a port from 0 to 65535.
    """
    host, _, port = text.strip().rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"telemetry.metrics_addr (--metrics-addr) must be [HOST:]PORT with a port from 0 to "
                          f"65535, got {text!r}")
    return host, int(port)


SECTIONS: dict[str, type[Section]] = {
    "workload": WorkloadConfig, "session": SessionConfig, "energy": EnergyConfig, "knobs": KnobConfig,
    "tune": TuneConfig, "launch": LaunchConfig, "telemetry": TelemetryConfig, "checkpoint": CheckpointConfig,
    "grid": GridConfig,
}


@dataclass(kw_only=True)
class RunConfig(Tree):
    """Everything a run was asked to do: the root of the configuration tree.

    Besides each section's own checks, ``__post_init__`` checks what several sections must agree on (the same
    for ``dtpo train``, a configuration file and ``dtpo.Session(run_config=...)``): more steps than warm-up
    steps, ``--tune`` of GPU knobs without fixed knobs, ``--tune stragglers`` on several workers, and job-knob
    tuning with energy measured (unless it tunes for time) and compression only under DDP on several workers.
    What depends on the machine (a GPU with knobs, a precision the device runs, a free metrics port, threads
    per worker) is checked by the command that starts the run.
    """

    SECTIONS: ClassVar[dict[str, type[Section]]] = SECTIONS
    SCHEMA: ClassVar[str | None] = CONFIG_SCHEMA

    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    """What to train."""
    session: SessionConfig = field(default_factory=SessionConfig)
    """How the Session trains and measures."""
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    """Energy measurement and its price."""
    knobs: KnobConfig = field(default_factory=KnobConfig)
    """GPU knobs held for the run."""
    tune: TuneConfig = field(default_factory=TuneConfig)
    """GPU knobs tuned while training."""
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    """Local workers and where the record goes."""
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    """Run store, live metrics, traces and report."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints and resuming."""
    grid: GridConfig = field(default_factory=GridConfig)
    """A grid signal the power limit follows."""

    def _check_rules(self) -> None:
        steps, warmup = self.workload.steps, self.session.warmup_steps
        if steps is not None and steps <= warmup:
            raise ConfigError(f"workload.steps ({steps}) must be larger than session.warmup_steps ({warmup}): "
                              f"warm-up steps are not measured, so nothing would be (--steps, --warmup-steps)")
        if self.grid.enabled and self.grid.policy == "pause" and self.tune.knob is not None:
            raise ConfigError(f"--grid-policy pause schedules the whole run against the signal; drop --tune "
                              f"{self.tune.knob}")
        if self.grid.enabled and self.grid.policy == "throttle" and (self.tune.knob is not None
                                                                      or self.knobs.requested):
            drop = "--tune" if self.tune.knob is not None else "--power-limit / --sm-clock / --power-smoothing"
            raise ConfigError(f"--grid-signal chooses the GPUs' power limit itself; drop {drop}")
        tune = self.tune
        if tune.knob is None:
            return
        if tune.job_knobs:
            if not self.energy.enabled and tune.cost != "time":
                raise ConfigError(f"--tune {tune.knob} --cost {tune.cost} needs energy measured: drop "
                                  "--no-energy, or tune for --cost time")
            if "compression" in tune.job_knobs and (self.launch.workers < 2 or self.session.strategy != "ddp"):
                raise ConfigError("--tune compression needs DDP on 2 or more workers (--workers 2 --strategy "
                                  "ddp): gradients are compressed in DDP's all-reduce")
            return
        if tune.rebalance:
            self._check_rebalance()
        if self.knobs.requested and tune.knob != "rebalance":
            smoothing = " / --power-smoothing" if self.knobs.power_smoothing is not None else ""
            raise ConfigError(f"--tune {tune.knob} chooses the GPU settings itself; drop --power-limit / --sm-clock"
                              f"{smoothing}")
        if tune.stragglers and self.launch.workers < 2:
            raise ConfigError(f"--tune {tune.knob} slows down ranks that wait for others: it needs --workers 2 or "
                              "more")

    def _check_rebalance(self) -> None:
        """What ``--tune rebalance`` needs, known before launch."""
        knob = self.tune.knob
        if self.launch.workers < 2:
            raise ConfigError(f"--tune {knob} moves samples between ranks: it needs --workers 2 or more")
        if self.session.strategy != "ddp":
            raise ConfigError(f"--tune {knob} needs --strategy ddp: FSDP shards the model over equal batches, so "
                              "the shares cannot change")
        if self.session.grad_accum != 1:
            raise ConfigError(f"--tune {knob} cuts each step's batch into per-rank shares and cannot yet combine "
                              f"with --grad-accum {self.session.grad_accum}: drop --grad-accum")
        batch = self.workload.batch_size
        if batch is not None and batch < 2:
            raise ConfigError(f"--tune {knob} needs at least 2 samples per rank to move (--batch-size {batch})")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the tree as JSON (atomically, with the umask's permissions)."""
        out = Path(path)
        write_json_atomic(out, self.to_dict())
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunConfig:
        """Read a tree from a JSON or TOML file, or from a run directory's ``config.json``."""
        source = Path(path)
        if source.is_dir():
            source = source / CONFIG_FILE
        try:
            text = source.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"no configuration file at {source}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read configuration {source}: {exc.strerror or exc}") from None
        try:
            if source.suffix.lower() == ".toml":
                data = tomllib.loads(text)
            else:
                data = json.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"configuration {source} is not valid {source.suffix.lstrip('.') or 'JSON'}: "
                              f"{str(exc).splitlines()[0]}") from None
        return cls.from_dict(data)


def config_fields() -> list[ConfigField]:
    """Every leaf of the run's tree, in declaration order."""
    return tree_fields(RunConfig)
