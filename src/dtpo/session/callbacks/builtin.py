"""The built-in callbacks every producer of the step stream gets, and their assembly: GPU knobs, a tuner,
energy windows, progress display, live metrics, partial-record flushes and the run's artifacts (traces,
report) when no launcher writes them."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from dtpo.core.callbacks import Callback
from dtpo.core.config import RunConfig
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.core.steps import RunView, Window
from dtpo.devices import virtual_nvml
from dtpo.devices.discovery import discover
from dtpo.distributed.heartbeat import HeartbeatWriter
from dtpo.distributed.process_group import DistContext
from dtpo.session.callbacks.energy import EnergyCallback
from dtpo.session.callbacks.heartbeat import HeartbeatCallback
from dtpo.session.callbacks.slowdown import NOTE, SlowdownCallback, slowed_gpu
from dtpo.session.tuning.gpu_knobs import KnobCallback, rank_gpus
from dtpo.session.tuning.grid import GridCallback
from dtpo.session.tuning.grid_pause import GridPauseCallback
from dtpo.session.tuning.job_knobs import JobTuneCallback
from dtpo.session.tuning.power import TuneCallback
from dtpo.session.tuning.rebalance import RebalanceCallback
from dtpo.session.tuning.stragglers import StragglerCallback
from dtpo.telemetry.artifacts import write_artifacts
from dtpo.telemetry.progress import StepProgress

log = logging.getLogger(__name__)


def builtin_callbacks(config: RunConfig, ctx: DistContext, progress: bool,
                      clock: Callable[[], float] = time.perf_counter) -> tuple[list[Callback], EnergyCallback | None]:
    """The callbacks that come before the user's: the heartbeat to the launcher (where one watches), knobs
    (restored before anything else at the end), then a tuner, energy, progress and live metrics.

    Args:
        config: The run's configuration.
        ctx: Where this rank sits (its device says whether to look for GPUs).
        progress: Show progress on rank 0.
        clock: Seconds for the power tuner's block times (the producer's clock).

    Returns:
        The callbacks in call order, and the energy callback among them (``None`` when energy is off).
    """
    out: list[Callback] = []
    heartbeat_dir = LaunchContract.from_environ().heartbeat_dir
    if heartbeat_dir is not None:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0) or 0)
        out.append(HeartbeatCallback(HeartbeatWriter(heartbeat_dir, ctx.rank, ctx.local_rank, attempt)))
    # GPUs are looked for where the rank computes on one, or where virtual GPUs stand in for them (a CPU run
    # whose GPU figures are simulated: DTPO_VIRTUAL_GPUS)
    cuda = ctx.device.type == "cuda" or virtual_nvml.requested() is not None
    energy: EnergyCallback | None = None
    energy_devices = None
    if config.energy.enabled:
        found = discover(local_rank=ctx.local_rank, gpus=cuda, node_shared=ctx.local_rank == 0,
                         cpu_tdp_w=config.energy.cpu_tdp_w)
        if ctx.rank == 0:
            for note in found.notes:
                log.info("energy: %s", note)
        slowed = slowed_gpu(found.devices)  # a virtual GPU made with slow steps: a labelled delay in compute
        if slowed is not None:
            found.notes.append(NOTE)
            out.append(SlowdownCallback(slowed))
            if ctx.rank == 0:
                log.warning("energy: %s", NOTE)
        energy = EnergyCallback(found, config.session.warmup_steps, config.energy.sample_interval_s)
        energy_devices = found.devices
    if config.knobs.requested:
        out.append(KnobCallback(config.knobs, rank_gpus(energy_devices, ctx.local_rank, cuda)))
    if config.tune.job_knobs:
        out.append(JobTuneCallback(config.tune))
    elif config.tune.rebalance:
        out.append(RebalanceCallback(config.knobs.mode, rank_gpus(energy_devices, ctx.local_rank, cuda),
                                     clocks=config.tune.stragglers, max_share=config.tune.rebalance_max_share))
    elif config.tune.stragglers:
        out.append(StragglerCallback(config.knobs.mode, rank_gpus(energy_devices, ctx.local_rank, cuda)))
    elif config.tune.knob is not None:
        out.append(TuneCallback(config.tune, config.knobs.mode, rank_gpus(energy_devices, ctx.local_rank, cuda),
                                clock=clock))
    elif config.grid.enabled and config.grid.policy == "throttle":  # never with --tune: the config refuses both
        out.append(GridCallback(config.grid, config.knobs.mode, rank_gpus(energy_devices, ctx.local_rank, cuda)))
    if energy is not None:
        out.append(energy)
    if config.grid.enabled and config.grid.policy == "pause":  # after energy: a pause starts where a window ended
        out.append(GridPauseCallback(config.grid))
    if progress and ctx.rank == 0:
        out.append(ProgressCallback())
    if config.telemetry.metrics_addr is not None:  # after energy and tuners: a window's figures are all in
        from dtpo.session.callbacks.metrics import MetricsCallback

        out.append(MetricsCallback(config.telemetry.metrics_addr))
    return out, energy


def closing_callbacks(config: RunConfig) -> list[Callback]:
    """The callbacks that come after the user's: partial-record flushes, and the artifacts where no launcher
    writes them."""
    out: list[Callback] = [FlushCallback(config.session.flush_every, config.session.warmup_steps)]
    if not LaunchContract.from_environ().launched:  # under dtpo launch, the launcher writes them once final
        out.append(ArtifactsCallback())
    return out


class ProgressCallback(Callback):
    """A live bar on a terminal (plain lines in a log) on rank 0: steps, loss, samples/s.

    It reads the steps' records as their window closes (:attr:`~dtpo.core.callbacks.Callback.live_step_end`), and
    between those moves the bar on as steps begin, at most every ``advance_every_s`` (slow steps show at once).
    """

    live_step_end = False

    def __init__(self, advance_every_s: float = 0.5) -> None:
        self.progress: StepProgress | None = None
        self.advance_every_s = advance_every_s
        self._advanced_at = 0.0

    def on_train_start(self, session: RunView) -> None:
        """Open the display (the target is known once ``batches(steps=...)`` was called)."""
        self.progress = StepProgress(session.target_steps, enabled=session.is_main)

    def on_step_begin(self, session: RunView, step: int) -> None:
        """Show the steps done so far when the display has not moved for a while."""
        progress = self.progress
        if progress is not None and progress.enabled:
            now = time.monotonic()
            if now - self._advanced_at >= self.advance_every_s:
                self._advanced_at = now
                progress.advance(step)

    def on_step_end(self, session: RunView, step_record: StepRecord) -> None:
        """Advance the display with the step's samples and loss."""
        if self.progress is not None:
            self.progress.update(step_record.step + 1, step_record.samples, step_record.loss)

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Remove the bar."""
        if self.progress is not None:
            self.progress.close()
            self.progress = None


class FlushCallback(Callback):
    """Writes this rank's partial record after the first measured step, then at the first window end after
    every ``every`` steps or ``every_s`` seconds, so a partial record's steps and energy windows agree.

    A flush rewrites the whole partial record, but encodes only the steps added since the last one
    (:mod:`dtpo.core.partial_text`): about 9 us per new step here, plus a copy of the text already encoded (8 ms
    at 20,000 steps, where encoding them all anew took 180 ms). Once the record holds ``paced_from`` steps,
    flushes are paced so that they take at most ``budget`` of the wall time: after a flush that took ``c``
    seconds, the next one waits at least ``c / budget`` seconds, whatever ``every`` says (what is copied still
    grows with the run). A normal end, an error or SIGTERM still writes everything; only a SIGKILL
    can lose the steps since the last flush.

    Args:
        every: Steps between flushes at least.
        warmup_steps: Steps before the first measured one.
        every_s: Seconds after which the next window end flushes even if fewer steps passed.
        budget: The largest share of wall time spent flushing a long record.
        paced_from: Recorded steps from which flushes are paced.
    """

    live_step_end = False  # acts on the first measured step only, which every producer hands over as it ends

    def __init__(self, every: int, warmup_steps: int, every_s: float = 30.0, budget: float = 0.005,
                 paced_from: int = 200) -> None:
        self.every = every
        self.warmup_steps = warmup_steps
        self.every_s = every_s
        self.budget = budget
        self.paced_from = paced_from
        self._last_step = 0
        self._last_time = time.monotonic()
        self._pause_s = 0.0  # the least time before the next flush, from the last one's cost

    def on_step_end(self, session: RunView, step_record: StepRecord) -> bool:
        """Flush after the first measured step (so even an early crash leaves a record); from then on (``True``) not
        be called again."""
        first_measured = getattr(session, "start_step", 0) + self.warmup_steps
        if step_record.step == first_measured:
            self._flush(session, step_record.step + 1)
        return step_record.step >= first_measured

    def on_window_end(self, session: RunView, window: Window) -> None:
        """Flush when due."""
        done = window.last_step + 1
        since = time.monotonic() - self._last_time
        if since >= self._pause_s and (done - self._last_step >= self.every or since >= self.every_s):
            self._flush(session, done)

    def _flush(self, session: RunView, done: int) -> None:
        start = time.monotonic()
        session.lifecycle.flush(status="running")
        self._last_step = done
        self._last_time = time.monotonic()
        long = len(session.lifecycle.rank.steps) >= self.paced_from
        self._pause_s = (self._last_time - start) / self.budget if long else 0.0



class ArtifactsCallback(Callback):
    """On rank 0 of a completed run started without ``dtpo launch`` (plain torchrun, or one process): write
    the run's traces and report next to its record (as its telemetry configuration says). Under ``dtpo launch``
    the launcher writes them once the record is final (restarts included), so they are not written twice.
    """

    def on_train_end(self, session: RunView, record: RunRecord | None) -> None:
        """Write the artifacts of the finished record."""
        if record is not None:
            write_artifacts(record, session.run_dir)
