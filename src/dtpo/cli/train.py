"""``dtpo train``: a built-in workload on local workers, through the same launch path as ``dtpo launch``.

The command resolves the whole :class:`~dtpo.core.config.RunConfig` before anything starts (the workload's
defaults filled in, threads per worker decided, the run directory checked), writes it to
``RUN_DIR/config.json``, and launches ``dtpo.workloads.train`` which reads it back: workers get the
configuration as data, never as re-parsed flags.
"""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dtpo.cli.conclude import conclude_run, end_run
from dtpo.cli.options import config_command
from dtpo.cli.register import open_store_for, registered
from dtpo.core.config import CONFIG_FILE, RunConfig
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord
from dtpo.distributed.run_dir import prepare_run_dir
from dtpo.telemetry.store.figures import config_kind
from dtpo.telemetry.store.paths import check_store_path

if TYPE_CHECKING:
    from dtpo.distributed.launch import LaunchOutcome

log = logging.getLogger(__name__)

def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_per_worker(config: RunConfig, environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """Compute threads for each worker: the configured value, else ``OMP_NUM_THREADS`` if the user set it,
    else the usable cores split between the workers (at least one each)."""
    if config.launch.threads_per_worker is not None:
        return config.launch.threads_per_worker
    user = environ.get("OMP_NUM_THREADS", "").strip()
    if user:
        if user.isdigit() and int(user) > 0:
            return int(user)
        raise ConfigError(f"OMP_NUM_THREADS must be a positive integer, got {user!r}")
    return max(1, usable_cores() // config.launch.workers)


def resolve(config: RunConfig) -> RunConfig:
    """Fill in what the defaults leave open (the workload's own steps, batch size and learning rate, the
    threads per worker) and check what depends on this machine.

    What the configuration's sections must agree on is checked by :class:`RunConfig` itself (also for
    ``dtpo.Session(run_config=...)``), and again here once the workload's defaults are filled in. What stays
    here needs more than the configuration: the workload registry (``dtpo.workloads``, above ``core``), the
    cost metrics' grammar (``dtpo.tune``), this machine's GPUs and device, a free metrics port, Ray, the
    checkpoints on disk, and the CPU cores this process may use (threads per worker: the affinity mask and
    ``$OMP_NUM_THREADS`` belong to the machine that launches, not to the configuration, which a file carries
    to other machines).
    """
    from dtpo.workloads import with_workload_defaults  # torch: imported only by commands that train

    config = check_framework(config)
    resolved = with_workload_defaults(config)
    if config.workload.framework != "torch":  # their scripts have their own learning rate (SGD, not AdamW)
        resolved = resolved.replace(workload={"lr": config.workload.lr})
    check_tuning(resolved)
    resolved = check_grid(resolved)
    if resolved.launch.engine == "ray":  # Ray importable, --ray-address answering: before the run dir is touched
        from dtpo.cli.ray_launch import check_ray_engine

        resolved = check_ray_engine(resolved)
    if resolved.telemetry.metrics_addr is not None:  # an address in use fails here, not in a worker
        from dtpo.telemetry.metrics_server import check_metrics_addr

        check_metrics_addr(resolved.telemetry.metrics_addr)
    from dtpo.workloads.train import check_checkpoints  # before the run directory is prepared: nothing cleared

    check_checkpoints(resolved)
    return resolved.replace(launch={"threads_per_worker": threads_per_worker(config)})


# What only dtpo.Session does, and so only the PyTorch workloads: (section, field, its default, the flag).
_SESSION_ONLY = (("session", "precision", "32-true", "--precision"), ("session", "strategy", "ddp", "--strategy"),
                 ("session", "grad_accum", 1, "--grad-accum"), ("session", "compression", "none", "--compression"),
                 ("launch", "engine", "torchrun", "--engine"), ("checkpoint", "every", None, "--checkpoint-every"))


def check_framework(config: RunConfig) -> RunConfig:
    """For ``--framework jax|tensorflow|keras``: the framework is installed, the workload is the MLP they all
    have, and nothing is asked that only ``dtpo.Session`` does (precision, strategy, accumulation, compression,
    job knobs, stragglers, Ray, checkpoints).

    Returns:
        ``config`` with the workload named ``mlp`` where it left the name at its default.

    Raises:
        ConfigError: One line naming what to change (or the extra to install).
    """
    framework = config.workload.framework
    if framework == "torch":
        return config
    from dtpo.core.config import WorkloadConfig
    from dtpo.core.frameworks import require

    require(framework)
    name = config.workload.name
    if name not in ("mlp", WorkloadConfig().name):
        raise ConfigError(f"--framework {framework} trains the built-in mlp only, got --workload {name}")
    for section, key, default, flag_name in _SESSION_ONLY:
        value = getattr(getattr(config, section), key, default)
        if value != default:
            raise ConfigError(f"{flag_name} {value} needs dtpo.Session, which trains the PyTorch workloads: drop it "
                              f"with --framework {framework}")
    if config.tune.needs_session:
        raise ConfigError(f"--tune {config.tune.knob} needs dtpo.Session, which trains the PyTorch workloads; "
                          f"with --framework {framework} dtpo tunes the GPU knobs (power-limit, sm-clock)")
    return config.replace(workload={"name": "mlp"})


def check_tuning(config: RunConfig) -> None:
    """Refuse a ``--tune`` request that cannot work on this machine, before any worker starts (what the
    configuration alone decides, :class:`RunConfig` has checked).

    Raises:
        ConfigError: A bad ``--cost``, no GPU whose knobs dtpo can reach, or a precision this device cannot run.
    """
    from dtpo.tune.cost import parse_cost

    tune = config.tune
    parse_cost(tune.cost)
    if tune.knob is None or tune.knob == "rebalance":  # rebalancing moves samples, not GPU settings
        return
    if tune.job_knobs:
        check_job_tuning(config)
        return
    why = _why_no_knob_gpus()
    if why is not None:
        example = (f"--gpus 16 --straggler 3:1.2 --tune {tune.knob}" if tune.stragglers
                   else f"--tune {tune.knob} --cost {tune.cost}")
        raise ConfigError(f"--tune {tune.knob} needs an NVIDIA GPU and this machine has none usable ({why}); "
                          f"`dtpo simulate {example}` runs the same tuner on simulated GPUs")


def _why_no_knob_gpus() -> str | None:
    """Why this machine has no NVIDIA GPU whose knobs dtpo can reach (``None``: it has one)."""
    from dtpo.devices.base import DeviceError
    from dtpo.devices.nvml import open_nvml_gpus

    try:
        gpus = [gpu for gpu in open_nvml_gpus() if gpu.knob_key is not None]
    except DeviceError as exc:
        return str(exc)
    for gpu in gpus:
        gpu.close()
    return None if gpus else "no GPU with power knobs"


def check_grid(config: RunConfig) -> RunConfig:
    """Refuse a ``--grid-signal`` run that cannot work, before any worker starts: a signal file dtpo cannot read
    (or with bad values), one that does not cover the run from its start (now, or the signal's first interval under
    ``--grid-replay``) to the deadline, or, to throttle, no GPU whose power limit dtpo can reach (a pause moves no
    knob).

    Returns:
        ``config`` with the signal's path made absolute (the workers read it).

    Raises:
        ConfigError: One line naming what to change.
    """
    grid = config.grid
    if not grid.enabled:
        return config
    from datetime import UTC, datetime

    from dtpo.session.tuning.grid import decision_signals

    assert grid.signal is not None and grid.deadline_h is not None
    path = Path(grid.signal).expanduser().resolve()
    accounted, decided, _ = decision_signals(path)
    start = accounted.start if grid.replay is not None else datetime.now(UTC)
    for signal in {id(s): s for s in (accounted, decided)}.values():
        signal.check_covers(start, grid.deadline_h * 3600, f"--deadline {grid.deadline_h:g}")
    if grid.policy == "pause":  # no GPU knob is touched; the pauses checkpoint (RUN_DIR/checkpoints by default)
        return config.replace(grid={"signal": str(path)})
    why = _why_no_knob_gpus()
    if why is not None:
        raise ConfigError(f"--grid-signal moves the GPUs' power limit and this machine has no GPU whose limit dtpo "
                          f"can reach ({why}); `dtpo simulate grid --grid-signal {grid.signal} --deadline "
                          f"{grid.deadline_h:g}` schedules simulated GPUs")
    return config.replace(grid={"signal": str(path)})


def check_job_tuning(config: RunConfig) -> None:
    """Refuse job-knob tuning whose starting precision this machine's device cannot run.

    Raises:
        ConfigError: One line naming the setting.
    """
    from dtpo.session.loop.precision import check_precision

    check_precision(config.session.precision, _training_device())


def _training_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def launch_training(config: RunConfig, run_dir: Path) -> LaunchOutcome:
    """Train ``config`` (already resolved) on ``config.launch.workers`` local processes through ``dtpo launch``,
    or through Ray Train with ``--engine ray``."""
    from dtpo.distributed.launch import launch, worker_environment
    from dtpo.distributed.launch_args import parse_launch_args

    if config.launch.engine == "ray":
        from dtpo.cli.ray_launch import launch_ray_training

        return launch_ray_training(config, run_dir)
    path = config.replace(launch={"run_dir": str(run_dir)}).save(run_dir / CONFIG_FILE)
    argv = ["--standalone", "--nproc-per-node", str(config.launch.workers), "--run-dir", str(run_dir)]
    if config.launch.backend:
        argv += ["--backend", config.launch.backend]
    if config.launch.max_restarts:
        argv += ["--max-restarts", str(config.launch.max_restarts)]
    argv += ["--stall-factor", repr(config.launch.stall_factor), "--stall-floor", repr(config.launch.stall_floor)]
    agent_path = None
    framework = config.workload.framework
    if framework == "torch":
        argv += ["--no-agent", "-m", "dtpo.workloads.train"]  # the workload reports through dtpo.Session
    else:  # the framework's own script, prepared by dtpo launch --framework, reports its steps itself
        from dtpo.agent import BOOT_DIR
        from dtpo.workloads import FRAMEWORK_WORKLOADS

        workload, agent_path = config.workload, BOOT_DIR
        argv += ["--framework", framework, "-m", FRAMEWORK_WORKLOADS[framework], "--steps", str(workload.steps),
                 "--batch-size", str(workload.batch_size), "--seed", str(workload.seed)]
        if workload.lr is not None:
            argv += ["--lr", repr(workload.lr)]
    threads = str(config.launch.threads_per_worker or threads_per_worker(config))
    with worker_environment({"OMP_NUM_THREADS": threads}):
        return launch(parse_launch_args(argv), config=path, agent_path=agent_path)


def run_training(config: RunConfig, dry_run: bool = False) -> RunRecord:
    """``dtpo train`` after parsing: resolve, prepare the run directory, register the run in the run store
    (``--store``; one that cannot be used stops here, before the launch), launch, conclude, register how the
    run ended (a failure to do so is only a warning: the record stays in the run directory)."""
    if dry_run:
        config = config.replace(knobs={"mode": "dry-run"})
    config = resolve(config)
    check_store_path(config.telemetry.store)
    run_dir = prepare_run_dir(config.launch.run_dir, overwrite=config.launch.overwrite)
    if config.grid.enabled and config.grid.policy == "pause" and not config.checkpoint.enabled:
        config = config.replace(checkpoint={"dir": str(run_dir / "checkpoints")})  # each pause saves one
    store = open_store_for(run_dir, config.telemetry.store)
    kind = config_kind(config.to_dict())
    with registered(store, kind, run_dir, config.replace(launch={"run_dir": str(run_dir)}).to_dict()) as entry:
        outcome = launch_training(config, run_dir)
        record = conclude_run(outcome) if outcome.recorded and outcome.run_dir is not None else None
        entry.record = record
        end_run(outcome, record)
    assert record is not None
    return record


def _train(config: RunConfig, dry_run: bool = False) -> None:
    """Train a built-in example workload on local workers and print where the time and energy went."""
    run_training(config, dry_run)


train_command = config_command(_train, extra=[inspect.Parameter(
    "dry_run", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
    default=typer.Option(False, "--dry-run", help="Same as --knob-mode dry-run: log GPU knob changes, make none."))])
