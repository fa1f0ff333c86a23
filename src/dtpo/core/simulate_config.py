"""The configuration tree of ``dtpo simulate``: the simulated job, the knobs it runs at or sweeps, the tuner run
on it, its stragglers, and where the result goes.

::

    SimulateConfig
      job         SimJobConfig         GPU model, workload, batch, GPUs, steps, model or trace, noise, seed
      knobs       SimKnobConfig        a power limit / SM clock held, or a knob swept
      tune        SimTuneConfig        dtpo's tuner on the job: the knob, the cost metric, the grid
      stragglers  SimStragglerConfig   slow ranks, their pattern and period
      grid        SimGridConfig        a grid signal, the policies scheduled against it, the deadline
      output      SimOutputConfig      JSON, run directory, run store; or only list the models

The tree says which of the command's modes it asks for (:attr:`SimulateConfig.mode`: one setting, a sweep,
the tuner, per-rank straggler slowdown, uneven per-rank batches with or without it, or the list of models) and
checks, in one line naming the flags, what the values must agree on for that mode. The limits of the simulated
job itself (GPUs, steps, the GPU model's range, a straggler pattern's name) are checked by the job, which knows
them; the documentation of the fields names them as ``{PLACEHOLDERS}`` the command fills in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from dtpo.core.config import TUNE_KNOBS
from dtpo.core.config_section import Section, Tree, flag
from dtpo.core.errors import ConfigError

__all__ = ["GRID_POLICY_CHOICES", "MODEL_CHOICES", "SIM_SWEEPS", "SimGridConfig",
           "SimJobConfig", "SimKnobConfig", "SimOutputConfig", "SimStragglerConfig",
           "SimTuneConfig", "SimulateConfig", "parse_stragglers", "rebalance_knob"]

MODEL_CHOICES: tuple[str, ...] = ("auto", "calibrated", "parametric")
SIM_SWEEPS: tuple[str, ...] = ("power-limit", "sm-clock")  # the knobs a simulation sweeps
STRAGGLER_TUNE = "stragglers"  # --tune stragglers: per-rank slowdown, simulate only (not a TUNE_KNOBS value)
REBALANCE_TUNE = "rebalance"  # --tune rebalance[,stragglers]: uneven per-rank batches (with per-rank slowdown)
DEFAULT_WORKLOAD = "resnet50"
DEFAULT_COST = "zeus:0.5"
DEFAULT_TUNE_STEP_W = 25.0
DEFAULT_COUNTER_PERIOD_S = 0.1
DEFAULT_PATTERN = "static"
DEFAULT_PERIOD_STEPS = 500
GRID_POLICY_CHOICES: tuple[str, ...] = ("blind", "throttle", "pause", "all")  # --grid-policy
DEFAULT_GRID_SLACK = 0.25  # --job-hours left out: the deadline gives the job this much slack
MODES: tuple[str, ...] = ("list", "stragglers", "rebalance", "tune", "sweep", "setting")


def _finite(flag_name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise ConfigError(f"{flag_name} must be a finite number, got {value:g}")


@dataclass(kw_only=True)
class SimJobConfig(Section):
    """The simulated job: which GPUs, how many, what they train, which model of them, and its noise."""

    SECTION: ClassVar[str] = "job"

    gpu: str = field(default="A40", metadata=flag("--gpu"))
    """GPU model (dtpo simulate list names them: A40, V100, H100-SXM, A100-SXM, MI250X, P100-PCIe, T4, L4, L40S,
    A100-PCIe, H100-PCIe, H200, B200, MI300X, ...). With --trace: the GPU it was measured on; left out, the one
    the file's gpu column names, else a GPU with the trace's own power-limit range."""
    workload: str | None = field(default=None, metadata=flag("--workload", short="-w"))
    """Workload (see --list; default {DEFAULT_WORKLOAD}). With --trace: which of the file's traces, as NETWORK,
    NETWORK/DATASET or NETWORK/DATASET/OPTIMIZER (default: the file's only one)."""
    batch_size: int | None = field(default=None, metadata=flag("--batch-size"))
    """Per-GPU batch (default: the model's). With --trace: picks the file's trace of that batch, or is the batch of
    a file without a batch_size column (default 1)."""
    gpus: int = field(default=8, metadata=flag("--gpus"))
    """Number of data-parallel GPUs (at most {MAX_GPUS:,})."""
    steps: int = field(default=1000, metadata=flag("--steps"))
    """Training steps per setting (at most {MAX_STEPS:,})."""
    model: str = field(default="auto", metadata=flag("--model"))
    """auto (calibrated where a measured trace exists), calibrated, parametric."""
    trace: Path | None = field(default=None, metadata=flag("--trace"))
    """Calibrate on your own measured power-limit sweep: a CSV with the shipped Zeus columns
    power_limit,time_per_epoch,average_power (W, s, W), optionally dataset,network,batch_size,optimizer and
    samples_per_epoch (needed unless the dataset is one dtpo knows) and gpu. Name its GPU with --gpu, or leave the
    power-limit range to the file."""
    noise: float = field(default=0.01, metadata=flag("--noise"))
    """Relative noise (std) on step time and power."""
    counter_period: float | None = field(default=None, metadata=flag("--counter-period"))
    """Energy-counter update period (s; default {DEFAULT_COUNTER_PERIOD_S:g})."""
    seed: int = field(default=0, metadata=flag("--seed"))
    """Noise seed."""

    def __post_init__(self) -> None:
        self._check_type("gpu", str, False)
        self._check_type("workload", str, True)
        self._check_type("model", str, False)
        self._path("trace")
        for name in ("batch_size", "gpus", "steps", "seed"):  # ranges: the simulated job's own checks
            self._check_type(name, int, name == "batch_size")
        self._optional_number("noise")
        self._optional_number("counter_period")


@dataclass(kw_only=True)
class SimKnobConfig(Section):
    """The GPU knobs every GPU runs at, or the knob swept over its settings."""

    SECTION: ClassVar[str] = "knobs"

    power_limit_w: float | None = field(default=None, metadata=flag("--power-limit"))
    """Power limit in watts on every GPU."""
    sm_clock_mhz: int | None = field(default=None, metadata=flag("--sm-clock"))
    """Lock SM clocks at this supported MHz."""
    sweep: str | None = field(default=None, metadata=flag("--sweep"))
    """Sweep a knob: power-limit or sm-clock."""

    def __post_init__(self) -> None:
        self._optional_number("power_limit_w")
        self._check_type("sm_clock_mhz", int, True)
        self._check_type("sweep", str, True)

    @property
    def fixed(self) -> bool:
        """Whether a power limit or an SM clock is held."""
        return self.power_limit_w is not None or self.sm_clock_mhz is not None


@dataclass(kw_only=True)
class SimTuneConfig(Section):
    """dtpo's tuner run on the simulated job (``--tune``), or per-rank straggler slowdown."""

    SECTION: ClassVar[str] = "tune"

    knob: str | None = field(default=None, metadata=flag("--tune"))
    """Run dtpo's tuner on the simulated job: power-limit, sm-clock or both (see --cost); or stragglers: slow down
    the ranks that only wait for the --straggler ranks; or rebalance: give each rank a share of the global batch
    that follows its speed (rebalance,stragglers: and slow down what still waits)."""
    cost: str | None = field(default=None, metadata=flag("--cost"))
    """What --tune minimises: energy, time, zeus:ETA, slowdown:FACTOR or dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR
    (default {DEFAULT_COST})."""
    step_w: float | None = field(default=None, metadata=flag("--tune-step"))
    """Power-limit grid of --tune, in watts (default {DEFAULT_TUNE_STEP_W:g})."""

    def __post_init__(self) -> None:
        self._check_type("knob", str, True)
        self._check_type("cost", str, True)
        self._optional_number("step_w")


@dataclass(kw_only=True)
class SimStragglerConfig(Section):
    """Ranks that compute slower than the others, and how their slowness moves."""

    SECTION: ClassVar[str] = "stragglers"

    straggler: str | None = field(default=None, metadata=flag("--straggler"))
    """RANK:FACTOR, one GPU that much slower; with --tune stragglers or rebalance a comma-separated list of them."""
    pattern: str | None = field(default=None, metadata=flag("--straggler-pattern"))
    """With --tune stragglers or rebalance: {PATTERNS} (default {DEFAULT_PATTERN}): the slow ranks stay, move on to
    the next rank every --period steps, or are slow for --period steps and then not."""
    period: int | None = field(default=None, metadata=flag("--period"))
    """With --tune stragglers or rebalance: steps between a drifting straggler's moves or an intermittent one's
    switches (default {DEFAULT_PERIOD_STEPS})."""

    def __post_init__(self) -> None:
        self._check_type("straggler", str, True)
        self._check_type("pattern", str, True)
        self._check_type("period", int, True)

    @property
    def ranks(self) -> tuple[tuple[int, float], ...]:
        """The stragglers as ``(rank, factor)`` pairs (see :func:`parse_stragglers`)."""
        return parse_stragglers(self.straggler)


@dataclass(kw_only=True)
class SimGridConfig(Section):
    """A grid signal (carbon intensity or price over time) and the policies that schedule the job against it."""

    SECTION: ClassVar[str] = "grid"

    signal: Path | None = field(default=None, metadata=flag("--grid-signal"))
    """Grid signal file: a time,value CSV (columns forecast and actual kept), WattTime v3, Electricity Maps v3 or UK
    carbon-intensity API JSON. Policies decide on its forecast (where it has one) and are judged on its actual
    values."""
    policy: str = field(default="all", metadata=flag("--grid-policy"))
    """blind (the default setting throughout), throttle (the power limit moves with the signal), pause (checkpoint
    and stop while it is high) or all."""
    deadline: float | None = field(default=None, metadata=flag("--deadline"))
    """Hours from the start by which the job must be done."""
    job_hours: float | None = field(default=None, metadata=flag("--job-hours"))
    """Length of the job at the default setting, hours (default: the deadline over 1 + {DEFAULT_GRID_SLACK:g}, a
    job with {DEFAULT_GRID_SLACK:.0%} slack)."""
    start: str | None = field(default=None, metadata=flag("--start"))
    """When the job starts, ISO time (UTC unless it names a zone; default: the signal's start); the start of one of
    the signal's intervals."""
    resume_s: float | None = field(default=None, metadata=flag("--resume-s"))
    """Seconds lost each time a paused job resumes (restart, restore, warm-up; default {DEFAULT_GRID_RESUME_S:g})."""

    def __post_init__(self) -> None:
        self._path("signal")
        self._check_type("policy", str, False)
        self._check_type("start", str, True)
        for name in ("deadline", "job_hours", "resume_s"):
            self._optional_number(name)
        if self.signal is None:
            given = [flag_name for flag_name, value in (("--deadline", self.deadline), ("--job-hours", self.job_hours),
                                                        ("--start", self.start), ("--resume-s", self.resume_s))
                     if value is not None]
            if given or self.policy != "all":
                raise ConfigError(f"{(given or ['--grid-policy'])[0]} schedules a job against a grid signal; name "
                                  "the signal with --grid-signal FILE")
            return
        self._choice("policy", GRID_POLICY_CHOICES)
        if self.deadline is None:
            raise ConfigError("--grid-signal needs --deadline HOURS: when the job must be done")
        for flag_name, value in (("--deadline", self.deadline), ("--job-hours", self.job_hours)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{flag_name} must be a finite number of hours > 0, got {value:g}")
        if self.resume_s is not None and not (math.isfinite(self.resume_s) and self.resume_s >= 0):
            raise ConfigError(f"--resume-s must be a finite number of seconds >= 0, got {self.resume_s:g}")

    @property
    def hours(self) -> float:
        """The job's length at the default setting (``--job-hours``, else the deadline less the default slack)."""
        assert self.deadline is not None
        return self.job_hours if self.job_hours is not None else self.deadline / (1 + DEFAULT_GRID_SLACK)


@dataclass(kw_only=True)
class SimOutputConfig(Section):
    """Where the result goes besides the terminal; or only a list of what can be simulated."""

    SECTION: ClassVar[str] = "output"

    json: Path | None = field(default=None, metadata=flag("--json"))
    """Also write the results to this JSON file."""
    run_dir: Path | None = field(default=None, metadata=flag("--run-dir"))
    """Write the results here as simulate.json (default: runs/simulate-<run id>)."""
    store: str | None = field(default=None, metadata=flag("--store"))
    """SQLite run store the result is registered in (default: $DTPO_STORE, else runs/dtpo.sqlite)."""
    list: bool = field(default=False, metadata=flag("--list", negatable=False))
    """List GPU models and workloads (with --trace: the file's traces), then exit."""

    def __post_init__(self) -> None:
        self._path("json")
        self._path("run_dir")
        self._check_type("store", str, True)
        self._bool("list")


@dataclass(kw_only=True)
class SimulateConfig(Tree):
    """Everything ``dtpo simulate`` was asked to do."""

    SECTIONS: ClassVar[dict[str, type[Section]]] = {
        "job": SimJobConfig, "knobs": SimKnobConfig, "tune": SimTuneConfig, "stragglers": SimStragglerConfig,
        "grid": SimGridConfig, "output": SimOutputConfig}

    job: SimJobConfig = field(default_factory=SimJobConfig)
    """The simulated job."""
    knobs: SimKnobConfig = field(default_factory=SimKnobConfig)
    """Knobs held or swept."""
    tune: SimTuneConfig = field(default_factory=SimTuneConfig)
    """The tuner run on the job."""
    stragglers: SimStragglerConfig = field(default_factory=SimStragglerConfig)
    """Slow ranks."""
    grid: SimGridConfig = field(default_factory=SimGridConfig)
    """A grid signal and the policies scheduled against it."""
    output: SimOutputConfig = field(default_factory=SimOutputConfig)
    """JSON, run directory and run store."""

    @property
    def mode(self) -> str:
        """What is simulated: ``list`` (only the models), ``stragglers`` (per-rank slowdown), ``rebalance``
        (uneven per-rank batches, with per-rank slowdown or without: :func:`rebalance_knob`), ``tune`` (the
        power tuner), ``sweep`` (a knob over its settings) or ``setting`` (one setting against the default)."""
        if self.output.list:
            return "list"
        if self.tune.knob == STRAGGLER_TUNE:
            return "stragglers"
        if rebalance_knob(self.tune.knob) is not None:
            return "rebalance"
        if self.tune.knob is not None:
            return "tune"
        return "sweep" if self.knobs.sweep is not None else "setting"

    def _check_rules(self) -> None:
        job, knobs, tune = self.job, self.knobs, self.tune
        if job.trace is not None and job.model == "parametric":
            raise ConfigError("--model parametric cannot use --trace: a measured trace gives a calibrated model")
        if self.mode == "list":
            return
        if job.model not in MODEL_CHOICES:
            raise ConfigError(f"--model must be one of {', '.join(MODEL_CHOICES)}, got {job.model!r}")
        if knobs.sweep is not None and knobs.sweep not in SIM_SWEEPS:
            raise ConfigError(f"--sweep must be one of {', '.join(SIM_SWEEPS)}, got {knobs.sweep!r}")
        if (knobs.sweep == "power-limit" and knobs.power_limit_w is not None
                or knobs.sweep == "sm-clock" and knobs.sm_clock_mhz is not None):
            raise ConfigError(f"--sweep {knobs.sweep} already sets that knob; drop the fixed value")
        for flag_name, value in (("--power-limit", knobs.power_limit_w), ("--noise", job.noise),
                                 ("--counter-period", job.counter_period)):
            _finite(flag_name, value)
        if self.mode in ("stragglers", "rebalance"):
            self._check_stragglers()
            return
        if self.stragglers.pattern is not None or self.stragglers.period is not None:
            raise ConfigError(f"--straggler-pattern and --period apply only to --tune {STRAGGLER_TUNE}")
        if tune.knob is not None:
            if REBALANCE_TUNE in tune.knob.split(","):
                raise ConfigError(f"--tune {REBALANCE_TUNE} combines only with {STRAGGLER_TUNE} "
                                  f"({REBALANCE_TUNE},{STRAGGLER_TUNE}), got {tune.knob!r}")
            if tune.knob not in TUNE_KNOBS:
                raise ConfigError(f"--tune must be one of {', '.join(TUNE_KNOBS)}, got {tune.knob!r} (or "
                                  f"{STRAGGLER_TUNE}, with --straggler, to slow down the ranks that wait for a "
                                  f"straggler; or {REBALANCE_TUNE}[,{STRAGGLER_TUNE}], to split the batch by speed)")
            if knobs.sweep is not None or knobs.fixed:
                raise ConfigError("--tune chooses the settings itself; drop --sweep, --power-limit and --sm-clock")
            _finite("--tune-step", tune.step_w)
            if tune.step_w is not None and tune.step_w <= 0:
                raise ConfigError(f"--tune-step must be > 0 W, got {tune.step_w:g}")
        ranks = self.stragglers.ranks
        if len(ranks) > 1:
            raise ConfigError(f"--straggler {self.stragglers.straggler} names {len(ranks)} stragglers; only --tune "
                              f"{STRAGGLER_TUNE} simulates several (as does --tune {REBALANCE_TUNE}; the other modes "
                              "take one RANK:FACTOR)")

    def _check_stragglers(self) -> None:
        """A one-line error for an option that ``--tune stragglers`` (or ``rebalance[,stragglers]``) cannot take."""
        job, knobs, tune = self.job, self.knobs, self.tune
        name = tune.knob
        if knobs.sweep is not None or knobs.fixed:
            raise ConfigError(f"--tune {name} chooses each rank's clock itself; drop --sweep, "
                              "--power-limit and --sm-clock")
        if job.trace is not None:
            raise ConfigError(f"--tune {name} runs on the shipped models; it cannot use --trace yet")
        if job.model != "auto":
            raise ConfigError(f"--tune {name} picks the model itself (calibrated where a trace exists); "
                              "drop --model")
        for flag_name, value in (("--cost", tune.cost), ("--tune-step", tune.step_w),
                                 ("--counter-period", job.counter_period)):
            if value is not None:
                raise ConfigError(f"--tune {name} does not use {flag_name} (it keeps each rank just ahead "
                                  "of the slowest one, and its energy is exact)")
        if self.mode == "rebalance" and job.gpus == 1:
            raise ConfigError(f"--tune {name} needs --gpus 2 or more: it splits the global batch between the "
                              "ranks, and one rank has nothing to split with")
        self.stragglers.ranks  # noqa: B018 - the list's grammar, before anything runs


def rebalance_knob(knob: str | None) -> bool | None:
    """Whether ``--tune`` asks for uneven per-rank batches, and with per-rank slowdown: ``rebalance`` -> ``False``,
    ``rebalance,stragglers`` or ``stragglers,rebalance`` -> ``True``; anything else -> ``None``."""
    if knob is None:
        return None
    parts = [part.strip() for part in knob.split(",")]
    if REBALANCE_TUNE not in parts or len(parts) != len(set(parts)) or not set(parts) <= {REBALANCE_TUNE,
                                                                                             STRAGGLER_TUNE}:
        return None
    return STRAGGLER_TUNE in parts


def parse_stragglers(text: str | None) -> tuple[tuple[int, float], ...]:
    """``"3:1.25"`` -> rank 3 computes 1.25x slower; ``"3:1.2,5:1.1"`` -> two stragglers; ``None`` -> none.

    Raises:
        ConfigError: Not ``RANK:FACTOR[,RANK:FACTOR...]`` with finite factors above 0 and each rank once.
    """
    if not text:
        return ()
    out: list[tuple[int, float]] = []
    for item in text.split(","):
        rank, sep, factor = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            parsed = int(rank), float(factor)
        except ValueError:
            raise ConfigError(f"--straggler must be RANK:FACTOR[,RANK:FACTOR...], e.g. 3:1.2, got {text!r}") from None
        if not math.isfinite(parsed[1]) or parsed[1] <= 0:
            raise ConfigError(f"--straggler factor must be a finite number > 0, got {factor.strip()!r}")
        if parsed[0] in (r for r, _ in out):
            raise ConfigError(f"--straggler names rank {parsed[0]} twice")
        out.append(parsed)
    return tuple(out)
