"""``dtpo.StepReporter``: the step stream of a plain training loop that only says when each step ended.

The minimal producer of :mod:`dtpo.core.steps`. A loop that keeps its own model, optimizer and process group
reports each optimizer step's end and samples, and gets what a :class:`~dtpo.session.session.Session` run gets
from the same stream: the run record (``record.json``, partial records, traces), energy windows, the GPU
knobs and the power/clock tuner (``TuneConfig(knob="power-limit")``), progress and live metrics::

    with dtpo.StepReporter(total_steps=1000) as steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.step(samples=len(x))

A step runs from the end of the previous one (the first: from entering the ``with`` block) to the call of
:meth:`StepReporter.step` (on a GPU, to the end of the work queued before it: the call waits for the device,
as the Session does at each step's end); the whole step counts as compute (:func:`~dtpo.core.steps.plain_step`).
What needs the finer marks of the Session (straggler slack from gradient-ready times, the job knobs it switches
between steps) is refused with a one-line error.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from dtpo.core.callbacks import Callback
from dtpo.core.config import EnergyConfig, KnobConfig, RunConfig, SessionConfig, TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.core.logs import configure_logging
from dtpo.core.record import RankRecord, RunRecord
from dtpo.core.steps import SettingView, plain_step
from dtpo.distributed.process_group import DistContext, join
from dtpo.session.environment import describe_device
from dtpo.session.lifecycle import agree_on_run_dir
from dtpo.session.stream_run import StreamProducer, StreamRun, new_record

log = logging.getLogger(__name__)


class StepReporter(StreamProducer):
    """One rank's steps of a plain training loop, reported by their ends.

    Args:
        total_steps: Optimizer steps the loop will run, where known (progress, the tuner's saving estimate).
        warmup_steps: Steps left out of totals and windows.
        window_steps: Measured steps per window (what ``on_window_end`` callbacks receive).
        run_dir: Where rank 0 writes ``record.json`` (default: ``$DTPO_RUN_DIR`` or ``runs/<run-id>``).
        device: This rank's device (default: ``cuda:<local_rank>`` or the CPU): where GPUs are looked for,
            and where the tuners' all-reduce tensors live.
        energy: Measure energy (``True``/``False``, or an :class:`EnergyConfig`).
        knobs: GPU power limit / SM clock to hold for the run (:class:`KnobConfig`).
        tune: What to tune while training: ``TuneConfig(knob="power-limit")`` or ``"sm-clock"`` (GPU knobs).
        callbacks: Your own :class:`~dtpo.core.callbacks.Callback` s, after the built-in ones.
        progress: Show progress on rank 0.
        summary: Print the summary table on rank 0 at :meth:`finish`.
        flush_every: Write this rank's partial record every N steps.
        config: Extra settings to keep in the record (under ``config["user"]``).
        run_config: A whole :class:`~dtpo.core.config.RunConfig`; its session, energy, knob and tune sections
            (and its run directory, where ``run_dir`` is not given) replace the arguments above. What a plain
            loop does not say (precision, strategy) keeps the session section's defaults in the record.
        clock: Seconds for step times and the tuner's blocks (``time.perf_counter``; tests pass their own).
        context: Where this rank sits, made by the caller (another framework's script:
            :func:`~dtpo.frameworks.channel.framework_context`); the reporter then never waits for a CUDA device
            through torch: the caller waits for its own device where :attr:`settles_next` says so.
        device_name: How the record names this rank's device (default: from torch).

    Raises:
        ConfigError: Tuning that needs the Session's finer marks or switches (``stragglers``, job knobs).
    """

    def __init__(self, total_steps: int | None = None, *, warmup_steps: int = 2, window_steps: int = 10,
                 run_dir: str | os.PathLike[str] | None = None, device: torch.device | str | None = None,
                 energy: bool | EnergyConfig = True, knobs: KnobConfig | None = None, tune: TuneConfig | None = None,
                 callbacks: Sequence[Callback] = (), progress: bool = True, summary: bool = True,
                 flush_every: int = 50, config: dict[str, Any] | None = None, run_config: RunConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter, context: DistContext | None = None,
                 device_name: str | None = None) -> None:
        configure_logging()
        if total_steps is not None and total_steps < 0:
            raise ConfigError(f"total_steps must be >= 0, got {total_steps}")
        if run_config is None:
            run_config = RunConfig(
                session=SessionConfig(warmup_steps=warmup_steps, window_steps=window_steps, count_flops=False,
                                      flush_every=flush_every),
                energy=energy if isinstance(energy, EnergyConfig) else EnergyConfig(enabled=bool(energy)),
                knobs=knobs or KnobConfig(), tune=tune or TuneConfig())
        if run_config.tune.needs_session:
            raise ConfigError(f"--tune {run_config.tune.knob} needs dtpo.Session (its step marks and switches); "
                              "a StepReporter tunes GPU knobs only (power-limit, sm-clock)")
        self.run_config = run_config
        self.config: SessionConfig = run_config.session
        self.target_steps = total_steps
        self.start_step = 0
        self.clock = clock
        self._sync_cuda = context is None
        super().__init__(context if context is not None else join(device, run_config.launch.backend))
        self.run_dir = agree_on_run_dir(self.ctx, run_dir or run_config.launch.run_dir)
        record = new_record(self.ctx, self.run_dir, run_config, config)
        rank = RankRecord(self.ctx.rank, self.ctx.local_rank, self.ctx.node,
                          device_name or describe_device(self.device))
        self._run = StreamRun(self, self.ctx, self.run_dir, run_config, record, rank, callbacks, progress,
                              summary, clock=clock)
        self._step = 0
        self._started = False
        self._step_start: float | None = None  # the open step's start (clock), its Unix time next
        self._started_at = 0.0

    # -- what callbacks read (dtpo.core.steps.RunView) --------------------------------------------------------

    @property
    def switches(self) -> Mapping[str, SettingView]:
        """No settings switch between steps in a plain loop."""
        return {}

    @property
    def step_count(self) -> int:
        """Steps reported so far."""
        return self._step

    @property
    def settles_next(self) -> bool:
        """Whether the next :meth:`step` ends the warm-up, closes a window or is the last of ``total_steps``:
        where a caller whose device runs ahead of the host (JAX, TensorFlow) waits for the device, so that each
        window holds its own device time (and not more often, which would serialise the device)."""
        return self.settles_at(1)

    def settles_at(self, ahead: int) -> bool:
        """:attr:`settles_next` for the ``ahead``-th :meth:`step` from now (1: the next one)."""
        step, warm = self._step + ahead - 1, self.start_step + self.config.warmup_steps
        if step < warm:
            return step == warm - 1
        if self.target_steps is not None and step >= self.target_steps - 1:
            return step == self.target_steps - 1
        before = self._run.stream.open_steps + step - self._step if self._step >= warm else step - warm
        return (before + 1) % self.window_steps == 0

    @property
    def last_step_next(self) -> bool:
        """Whether the next :meth:`step` is the last of ``total_steps``."""
        return self.target_steps is not None and self._step == self.target_steps - 1

    @property
    def window_steps(self) -> int:
        """Measured steps per window."""
        return self._run.stream.window_steps

    # -- the loop ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start training: the callbacks' ``on_train_start``, and the first step begins (``with`` calls it)."""
        if self._started:
            return
        self._started = True
        self._run.stream.train_start()
        self._begin()

    def step(self, samples: int, tokens: int | None = None) -> None:
        """The current optimizer step ended, having processed ``samples`` samples (and ``tokens`` tokens, where
        counted) on this rank; the next step begins.

        Raises:
            ConfigError: A negative count.
        """
        if samples < 0 or (tokens is not None and tokens < 0):
            raise ConfigError(f"samples and tokens must be >= 0, got {samples} and {tokens}")
        if self.lifecycle.finished:
            raise RuntimeError("StepReporter.step() after finish()")
        self.start()
        assert self._step_start is not None
        if self._sync_cuda and self.device.type == "cuda":  # the host runs ahead: the step ends when its work is done
            torch.cuda.synchronize(self.device)
        step = self._step
        record = plain_step(step, step < self.start_step + self.config.warmup_steps, int(samples),
                            self._started_at, self.clock() - self._step_start, self.ctx.distributed,
                            tokens=None if tokens is None else int(tokens))
        self.lifecycle.rank.steps.append(record)
        self._step += 1
        self._run.stream.step_end(record)
        self._begin()

    def close_window(self) -> None:
        """Close the open window of steps now, so that work after the last step counts in no window."""
        self._run.stream.close_window()

    def finish(self, error: BaseException | None = None) -> RunRecord | None:
        """Gather every rank's measurements to rank 0, which writes ``record.json`` and prints a summary; after
        an error only this rank's partial record is written (see :meth:`dtpo.Session.finish`).

        Returns:
            The run record on rank 0, ``None`` on other ranks.
        """
        if self.lifecycle.finished:
            return None
        self.close_window()
        return self._run.finish(error)

    def __enter__(self) -> StepReporter:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.finish(error=exc)

    def _begin(self) -> None:
        """Open the next step: its callbacks first, then its start time."""
        self._run.stream.step_begin(self._step)
        self._started_at = time.time()
        self._step_start = self.clock()
