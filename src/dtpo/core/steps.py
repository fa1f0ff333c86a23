"""The step stream: what every producer of training steps emits and every consumer reads.

A *producer* (the :class:`~dtpo.session.session.Session`, a plain loop's
:class:`~dtpo.session.step_reporter.StepReporter`, ...) reports one rank's optimizer steps as
:class:`~dtpo.core.record.StepRecord` s, the step events: the step index, whether it is a warm-up step, when it
began (``started_at``) and how long it took (``step_s``), its samples and optionally its tokens, and the finer
marks where the producer knows them (data wait, compute up to the last gradient ready, the post-backward tail,
the optimizer). A producer that knows only the step's ends counts the whole step as compute and leaves the tail
unknown (see :func:`plain_step`). One stream is one rank's: the rank is the host's (:attr:`RunView.rank`).

The driver (:class:`~dtpo.core.stream.StepStream`) cuts the measured steps into :class:`Window` s and calls
the consumers' hooks (:class:`~dtpo.core.callbacks.Callback`); the hooks see their host through
:class:`RunView`, the part of a producer they may read, never through a concrete class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dtpo.core.record import RankRecord, RunRecord, StepRecord

if TYPE_CHECKING:
    import torch

    from dtpo.core.config import RunConfig, SessionConfig

__all__ = ["DistView", "EnergyView", "LifecycleView", "RunView", "SettingView", "StepRecord", "TunableRun",
           "Window", "plain_step"]


@dataclass(slots=True)
class Window:
    """A span of consecutive measured optimizer steps on one rank.

    Attributes:
        index: Windows counted from 0 (the first starts at the first measured step).
        first_step: First optimizer step in the window.
        last_step: Last optimizer step in the window (inclusive).
        time_s: Wall time from the start of ``first_step`` to the end of ``last_step``.
        samples: Samples this rank processed in the window.
        step_time_s: Median optimizer-step time in the window.
        energy_j: Joules per device over the window (empty when energy is not measured).
        sources: Energy source per device (``nvml-counter``, ``rapl``, ``modelled``, ...).
        estimated: True when any device's energy is modelled rather than read from a counter.
        settings: The switchable settings in force during the window (precision, accumulation, compression).
    """

    index: int
    first_step: int
    last_step: int
    time_s: float
    samples: int
    step_time_s: float
    energy_j: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    estimated: bool = False
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        """Optimizer steps in the window."""
        return self.last_step - self.first_step + 1

    @property
    def total_j(self) -> float | None:
        """Joules over all devices, or ``None`` when energy was not measured."""
        return sum(self.energy_j.values()) if self.energy_j else None

    @property
    def throughput(self) -> float:
        """Samples per second on this rank."""
        return self.samples / self.time_s if self.time_s > 0 else 0.0

    @property
    def joules_per_sample(self) -> float | None:
        """Energy per sample on this rank, or ``None`` when energy was not measured."""
        total = self.total_j
        return total / self.samples if total is not None and self.samples else None


def plain_step(step: int, warmup: bool, samples: int, started_at: float, step_s: float, distributed: bool,
               tokens: int | None = None) -> StepRecord:
    """The step event of a producer that knows only when a step began and ended.

    The whole step counts as compute; data wait and optimizer are 0. With other ranks the post-backward tail
    (and so communication and sync wait) is unknown (``None``), as under FSDP; alone they are 0.

    Args:
        step: Optimizer-step index, from 0.
        warmup: Whether the step is left out of totals.
        samples: Samples this rank processed in the step.
        started_at: Unix time the step began.
        step_s: Seconds the step took.
        distributed: Whether other ranks take part.
        tokens: Tokens this rank processed in the step, where the producer counts them.
    """
    unknown = None if distributed else 0.0
    return StepRecord(step=step, warmup=warmup, samples=samples, step_s=step_s, data_wait_s=0.0, compute_s=step_s,
                      tail_s=unknown, optimizer_s=0.0, started_at=started_at, comm_exposed_s=unknown,
                      sync_wait_s=unknown, tokens=tokens)


# -- what a callback may read of its host ----------------------------------------------------------------------


class DistView(Protocol):
    """Where this process sits in the run (:class:`~dtpo.distributed.process_group.DistContext` is one)."""

    @property
    def rank(self) -> int:
        """Global rank."""

    @property
    def local_rank(self) -> int:
        """Rank within its node."""

    @property
    def world_size(self) -> int:
        """Number of processes in the run."""

    @property
    def node(self) -> str:
        """Host name of this process's node."""

    @property
    def distributed(self) -> bool:
        """Whether a process group with other ranks is in use (the tuners' all-reduces need it)."""

    @property
    def group(self) -> Any:
        """The process group dtpo's own collectives go over (``None``: the default group)."""

    @property
    def collective_device(self) -> torch.device:
        """Where the tensors of those collectives live."""


class LifecycleView(Protocol):
    """This rank's record as it grows, and its partial flushes (:class:`~dtpo.session.lifecycle.RunLifecycle`)."""

    rank: RankRecord
    record: RunRecord

    def flush(self, status: str = "running") -> None:
        """Write this rank's partial record."""


class EnergyView(Protocol):
    """The built-in energy callback, as other callbacks read it
    (:class:`~dtpo.session.callbacks.energy.EnergyCallback`)."""

    windows: list[dict[str, Any]]
    discovery: Any  # the devices measured and how they were chosen (dtpo.devices.discovery.Discovery)


class SettingView(Protocol):
    """A switchable setting in force (:class:`~dtpo.session.loop.switches.Switch`)."""

    @property
    def value(self) -> Any:
        """The setting's current value."""


class RunView(Protocol):
    """What a callback may read of the producer that drives it: where the rank sits, the run's record and
    directory, the steps it was asked for, and the other callbacks. Every producer offers it.
    """

    @property
    def rank(self) -> int:
        """Global rank of this process."""

    @property
    def world_size(self) -> int:
        """Number of processes in the run."""

    @property
    def is_main(self) -> bool:
        """True on rank 0."""

    @property
    def ctx(self) -> DistView:
        """Where this process sits in the run."""

    @property
    def device(self) -> torch.device:
        """This rank's device: what the tuners' all-reduce tensors live on."""

    @property
    def run_dir(self) -> Path:
        """The run directory all ranks agreed on."""

    @property
    def run_config(self) -> RunConfig:
        """The whole configuration tree of the run."""

    @property
    def config(self) -> SessionConfig:
        """The run's session settings (warm-up, window steps, strategy, ...)."""

    @property
    def record(self) -> RunRecord:
        """The run's record (ranks and totals are filled at the end)."""

    @property
    def rank_record(self) -> RankRecord:
        """This rank's measurements so far."""

    @property
    def lifecycle(self) -> LifecycleView:
        """This rank's record and its partial flushes."""

    @property
    def start_step(self) -> int:
        """The step this attempt started at (more than 0 after resuming from a checkpoint)."""

    @property
    def target_steps(self) -> int | None:
        """The step training stops at, where known."""

    @property
    def energy(self) -> EnergyView | None:
        """The built-in energy callback, ``None`` when energy is not measured."""

    @property
    def callbacks(self) -> Sequence[Any]:
        """Every callback of the run, in call order."""

    @property
    def switches(self) -> Mapping[str, SettingView]:
        """The settings that can change between steps (empty where the producer has none)."""


class TunableRun(RunView, Protocol):
    """A producer whose job knobs a callback may turn between optimizer steps (the Session): what
    :class:`~dtpo.session.tuning.job_knobs.JobTuneCallback` needs besides :class:`RunView`."""

    grad_accum: int
    precision: Any  # dtpo.session.loop.precision.Precision
    comm: Any  # dtpo.distributed.comm_timing.GradientComm, or None

    @property
    def model(self) -> Any:
        """The wrapped model, ``None`` before it was wrapped."""

    def set_precision(self, name: str) -> None:
        """Switch the numeric precision from the next optimizer step."""

    def set_grad_accum(self, micro_batches: int, *, keep_global_batch: bool = False) -> None:
        """Switch the micro-batches per optimizer step from the next optimizer step."""

    def set_compression(self, name: str, powersgd_rank: int | None = None, *, error_feedback: bool = True) -> None:
        """Switch the gradient compression from the next optimizer step."""

    def request_probe(self, request: Any) -> None:
        """Run a probe pass (a gradient under another setting) before the next optimizer step."""

    def keep_probe_batch(self) -> None:
        """Keep the next batch for probe passes."""
