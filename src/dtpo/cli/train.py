"""``dtpo train``: a built-in workload on local workers, through the same launch path as ``dtpo launch``."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import typer

from dtpo.cli.runs import conclude_run
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord, new_run_id
from dtpo.dist.launch import LaunchOutcome, launch, parse_launch_args
from dtpo.examples import get_workload
from dtpo.session.config import EnergyConfig, KnobConfig, SessionConfig


@dataclass
class TrainOptions:
    """What ``dtpo train`` and ``dtpo bench`` pass to the example training script.

    Attributes:
        workload: ``lm``, ``mlp`` or ``cnn``.
        steps: Optimizer steps (``None``: the workload's default).
        batch_size: Per-worker micro-batch size (``None``: the workload's default).
        precision: ``32-true``, ``bf16-mixed`` or ``16-mixed``.
        grad_accum: Micro-batches per optimizer step.
        strategy: ``ddp`` or ``fsdp``.
        lr: Learning rate (``None``: the workload's default).
        seed: Seed for the model and the data.
        energy: Measurement of energy: on/off, CPU TDP, grid intensity, price.
        knobs: GPU power limit / SM clock for the run, and whether to apply, dry-run or only observe.
    """

    workload: str = "lm"
    steps: int | None = None
    batch_size: int | None = None
    precision: str = "32-true"
    grad_accum: int = 1
    strategy: str = "ddp"
    lr: float | None = None
    seed: int = 0
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    knobs: KnobConfig = field(default_factory=KnobConfig)

    def __post_init__(self) -> None:
        get_workload(self.workload)  # raises ConfigError naming the choices
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {self.steps}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        SessionConfig(precision=self.precision, strategy=self.strategy, grad_accum=self.grad_accum)

    def script_args(self) -> list[str]:
        """The training script's command line."""
        args = ["--workload", self.workload, "--precision", self.precision, "--grad-accum", str(self.grad_accum),
                "--strategy", self.strategy, "--seed", str(self.seed)]
        energy = self.energy
        for flag, value in (("--steps", self.steps), ("--batch-size", self.batch_size), ("--lr", self.lr),
                            ("--cpu-tdp", energy.cpu_tdp_w), ("--price-per-kwh", energy.price_per_kwh)):
            if value is not None:
                args += [flag, str(value)]
        args += ["--grid-intensity", str(energy.grid_g_per_kwh)]
        knobs = self.knobs
        for flag, value in (("--power-limit", knobs.power_limit_w), ("--sm-clock", knobs.sm_clock_mhz)):
            if value is not None:
                args += [flag, str(value)]
        if knobs.requested:
            args += ["--knob-mode", knobs.mode]
        return args + ([] if energy.enabled else ["--no-energy"])


def check_workers(workers: int) -> None:
    """Reject a worker count below 1."""
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")


def launch_training(options: TrainOptions, workers: int, run_dir: Path) -> LaunchOutcome:
    """Train ``options.workload`` on ``workers`` local processes through ``dtpo launch``."""
    check_workers(workers)
    # Split the cores between workers instead of torchrun's blanket OMP_NUM_THREADS=1.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    argv = ["--standalone", "--nproc-per-node", str(workers), "--run-dir", str(run_dir),
            "-m", "dtpo.examples.train", *options.script_args()]
    return launch(parse_launch_args(argv))


def train_command(
    workload: str = typer.Option("lm", help="Built-in workload: lm (character-level GPT), mlp, cnn."),
    workers: int = typer.Option(2, help="Local worker processes."),
    steps: int = typer.Option(None, help="Optimizer steps (default: the workload's)."),
    batch_size: int = typer.Option(None, help="Micro-batch size per worker (default: the workload's)."),
    precision: str = typer.Option("32-true", help="32-true, bf16-mixed or 16-mixed."),
    grad_accum: int = typer.Option(1, help="Micro-batches per optimizer step."),
    strategy: str = typer.Option("ddp", help="ddp or fsdp."),
    lr: float = typer.Option(None, help="Learning rate (default: the workload's)."),
    seed: int = typer.Option(0, help="Seed for the model and the data."),
    run_dir: Path = typer.Option(None, help="Where to write the record (default: runs/<run-id>)."),
    energy: bool = typer.Option(True, help="Measure energy (NVML, RAPL, else a model labelled estimated)."),
    cpu_tdp: float = typer.Option(None, help="CPU TDP in watts for the modelled CPU (default: a table)."),
    grid_intensity: float = typer.Option(475.0, help="Grid carbon intensity, g CO2e per kWh."),
    price_per_kwh: float = typer.Option(None, help="Electricity price per kWh, for the cost figure."),
    power_limit: float = typer.Option(None, help="GPU power limit (W) for the run; restored afterwards."),
    sm_clock: int = typer.Option(None, help="Lock GPU SM clocks at this supported MHz for the run."),
    knob_mode: str = typer.Option("apply", help="apply, dry-run (log what would be set) or observe."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Same as --knob-mode dry-run."),
) -> None:
    """Train a built-in example workload on local workers and print where the time and energy went."""
    energy_config = EnergyConfig(enabled=energy, cpu_tdp_w=cpu_tdp, grid_g_per_kwh=grid_intensity,
                                 price_per_kwh=price_per_kwh)
    knobs = KnobConfig(power_limit, sm_clock, "dry-run" if dry_run else knob_mode)
    options = TrainOptions(workload, steps, batch_size, precision, grad_accum, strategy, lr, seed, energy_config,
                           knobs)
    check_workers(workers)
    outcome = launch_training(options, workers, run_dir or Path("runs") / new_run_id())
    record: RunRecord | None = conclude_run(outcome)
    if outcome.failed or record is None:
        print(f"dtpo: run failed: {outcome.message or 'no record was written'}; see {outcome.run_dir}",
              file=sys.stderr)
        raise typer.Exit(1)
