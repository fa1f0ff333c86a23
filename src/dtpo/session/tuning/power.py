"""``--tune``: the power tuner as a Session callback, on this rank's real GPUs.

Every rank measures its own GPUs (their energy counters, read at block boundaries) and its step times; at the
end of each block the ranks sum samples and energy and take the longest time (one all-reduce each), so every
rank feeds the same figures to its own :class:`~dtpo.tune.tuner.PowerTuner` and reaches the same decisions
without a coordinator. Each rank applies the settings to its own GPUs through the journaled
:class:`~dtpo.devices.knobs.KnobController`: original settings are journaled before the first change and
restored when the rank stops, on SIGINT/SIGTERM, or by the next dtpo start after a crash.

In ``dry-run`` and ``observe`` mode, or when ``apply`` meets "no permission", nothing is changed: the tuner
cannot measure other settings, so it measures the default setting on the real GPU and then runs the same
tuner on a parametric model of this GPU matched to that measurement. What it reports then is a *model
figure*, and the record says so (``"source": "model"``).

A saved profile of the same job (:mod:`dtpo.tune.profile`) starts the run at its optimum with no profiling.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dtpo.core.callbacks import Callback
from dtpo.core.config import TuneConfig
from dtpo.core.record import RankRecord, StepRecord
from dtpo.core.record_sections import PowerTuning
from dtpo.core.steps import RunView
from dtpo.core.tuner_status import ClockLock, TunerState
from dtpo.devices.base import Device, KnobError
from dtpo.devices.knobs import KnobController, log_knob_action
from dtpo.devices.physics.power_specs import match_power_spec
from dtpo.session.tuning.gpu_knobs import ranks_agree_on_limits
from dtpo.tune.cost import CostContext, parse_cost
from dtpo.tune.knob import apply_setting, make_knobs
from dtpo.tune.prior import model_guess, within_limits
from dtpo.tune.profile import JobFingerprint, ProfileStore
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, SettingStats
from dtpo.tune.tuner import Phase, PowerTuner, TunerOptions

log = logging.getLogger(__name__)


class TuneCallback(Callback):
    """Tunes this rank's GPU knobs while training; see the module docs.

    Args:
        config: What to tune and toward which cost.
        mode: The knob mode (``apply``, ``dry-run``, ``observe``).
        gpus: This rank's GPUs with knobs.
        clock: Seconds for block times (``time.perf_counter``; tests pass their own).
        options: Search parameters (default: blocks of at least 0.2 s and warm-ups of at least 0.1 s, since
            NVML's energy counter updates every few tens of milliseconds, or power is polled every 0.1 s).
    """

    def __init__(self, config: TuneConfig, mode: str, gpus: list[Device],
                 clock: Callable[[], float] = time.perf_counter, options: TunerOptions | None = None) -> None:
        self.config = config
        self.clock = clock
        self.options = options or TunerOptions(min_block_s=0.2, min_warmup_s=0.1)
        self.mode = mode
        self.gpus = gpus
        self.metric = parse_cost(config.cost)
        self.tuner: PowerTuner | None = None
        self.controller: KnobController | None = None
        self.applied: GpuSetting | None = None
        self.source = "measured"
        self.note = ""
        self.profile: dict[str, Any] = {}
        self._store = ProfileStore(config.profile_dir)
        self._fingerprint: JobFingerprint | None = None
        self._profile_checked = False
        self._profile_saved = False
        self._model_result: dict[str, Any] | None = None
        self._block_start: float | None = None
        self._energy_start = 0.0
        self._steps = self._samples = 0

    # -- start ---------------------------------------------------------------------------------------------

    def on_train_start(self, session: RunView) -> None:
        """Build the tuner from the GPUs' knob ranges and put them at the default setting."""
        limits = self.gpus[0].knob_limits() if self.gpus else None
        if not ranks_agree_on_limits(session, limits):
            self.gpus = []  # every rank tunes, or none: the block all-reduces need them all
        if not self.gpus or limits is None:
            if session.rank == 0:
                log.warning("tune: not every rank has a GPU with power knobs (the same range on all), so --tune %s "
                            "does nothing (`dtpo simulate --tune %s` runs the same tuner on simulated GPUs)",
                            self.config.knob, self.config.knob)
            return
        knobs = make_knobs(self.config.knob or "power-limit", limits, self.config.step_w)
        context = CostContext(gpus=session.world_size * len(self.gpus), max_power_w=limits.max_power_limit_w)
        default = GpuSetting(limits.max_power_limit_w, None)
        spec = match_power_spec(self.gpus[0].info.name)
        guess = model_guess(spec, self.metric, context) if spec is not None else None
        self.tuner = PowerTuner(knobs, self.metric, context, default, self.options, guess=guess)
        self.controller = KnobController(self.mode, log=log_knob_action)
        self.controller.__enter__()
        current = GpuSetting(self.gpus[0].knob_state().power_limit_w, None)
        self._apply(default, current)
        if self.controller.mode != "apply":
            self._to_model_mode()

    def _apply(self, setting: GpuSetting, previous: GpuSetting | None) -> None:
        assert self.controller is not None
        try:
            apply_setting(self.controller, self.gpus, setting, previous)
        except KnobError as exc:
            log.warning("tune: %s; tuning stops and the GPUs go back to their settings", exc)
            self.controller.restore()
            self.controller.mode = "observe"
        self.applied = setting
        if self.controller.mode != "apply" and self.source == "measured":
            self._to_model_mode()

    def _to_model_mode(self) -> None:
        self.source = "model"
        self.note = (f"{self.controller.mode if self.controller else self.mode} mode: the GPUs were not changed; "
                     "the choice is a model figure (this GPU's parametric model matched to the power measured at "
                     "the default setting)")

    # -- per step ----------------------------------------------------------------------------------------------

    def _energy(self) -> float:
        return sum(gpu.energy_j() for gpu in self.gpus)

    def on_step_begin(self, session: RunView, step: int) -> None:
        """Open a block: the time and energy it starts at."""
        if self.tuner is None or self._block_start is not None:
            return
        self._energy_start = self._energy()
        self._block_start = self.clock()

    def on_step_end(self, session: RunView, step_record: StepRecord) -> None:
        """Count the step; at the end of a block, agree on its figures across ranks and feed the tuner."""
        tuner = self.tuner
        if tuner is None or self._block_start is None:
            return
        if step_record.warmup:  # the Session's own warm-up steps are not representative: start afresh
            self._block_start = None
            return
        self._steps += 1
        self._samples += step_record.samples
        if self._steps < tuner.block_steps:
            return
        block = self._close_block(session)
        if self.source == "model":
            self._model_block(session, block)
            return
        if not self._profile_checked and tuner.phase is not Phase.WAIT:
            self._check_profile(session)
        wanted = tuner.feed(block)
        if tuner.holding and not self._profile_saved:
            self._save_profile(session)
        if wanted != self.applied:
            self._apply(wanted, self.applied)

    def _close_block(self, session: RunView) -> Block:
        assert self._block_start is not None
        elapsed = self.clock() - self._block_start
        energy = self._energy() - self._energy_start
        steps, samples = self._steps, self._samples
        self._block_start, self._steps, self._samples = None, 0, 0
        if session.ctx.distributed:
            device, group = session.ctx.collective_device, session.ctx.group
            sums = torch.tensor([float(samples), energy], dtype=torch.float64, device=device)
            longest = torch.tensor([elapsed], dtype=torch.float64, device=device)
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
            dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
            samples, energy, elapsed = int(sums[0].item()), float(sums[1].item()), float(longest[0].item())
        return Block(steps, samples, elapsed, energy)

    # -- profiles -------------------------------------------------------------------------------------------

    def fingerprint(self, session: RunView) -> JobFingerprint:
        """This job's identity for saved profiles."""
        rank = session.lifecycle.rank
        samples = max(session.lifecycle.rank.steps[-1].samples, 1) if rank.steps else 0
        return JobFingerprint(
            gpu=self.gpus[0].info.name.split("(", 1)[-1].rstrip(")"), gpus=session.world_size * len(self.gpus),
            batch_size=samples * session.world_size, precision=session.config.precision,
            flops_per_step=float(rank.flops_per_step or 0.0), knob=self.config.knob or "power-limit",
            grid=f"{self.config.step_w:g}W", workload=str(session.run_config.workload.name))

    def _check_profile(self, session: RunView) -> None:
        """Rank 0 reads a saved profile and shares it, so every rank starts from the same figures."""
        self._profile_checked = True
        self._fingerprint = self.fingerprint(session)
        measured = None
        if session.rank == 0 and not self.config.fresh_profile:
            measured = self._store.load(self._fingerprint)
        if session.ctx.distributed:
            shared = [measured]
            dist.broadcast_object_list(shared, src=0, group=session.ctx.group)
            measured = shared[0]
        if measured:
            assert self.tuner is not None
            choice = self.tuner.start_from_profile(measured)
            self._profile_saved = True
            self.profile = {"loaded": str(self._store.path(self._fingerprint)), "key": self._fingerprint.key}
            if session.rank == 0:
                log.info("tune: saved profile %s of this job: holding %s without profiling",
                         self._store.path(self._fingerprint), choice.label)

    def _save_profile(self, session: RunView) -> None:
        self._profile_saved = True
        if session.rank != 0 or self.tuner is None or self._fingerprint is None:
            return
        path = self._store.save(self._fingerprint, list(self.tuner.stats.values()), self.metric.name,
                                self.tuner.choice)
        if path is not None:
            self.profile = {"saved": str(path), "key": self._fingerprint.key}

    # -- model mode ----------------------------------------------------------------------------------------

    def _model_block(self, session: RunView, block: Block) -> None:
        """Measure the default on the real GPU, then tune a model of this GPU matched to it."""
        tuner = self.tuner
        assert tuner is not None
        if self._model_result is not None:
            return
        tuner.feed(block)  # the default is all the real GPU runs: the first visit measures it
        if tuner.phase is Phase.WAIT or tuner.current == tuner.default:
            return
        self._model_result = self._tune_model()
        if session.rank == 0 and self._model_result.get("choice"):
            choice = GpuSetting.from_dict(self._model_result["choice"])
            log.info("tune (model figure): would choose %s for %s", choice.label, self.metric.describe())
        if self.controller is not None and self.controller.mode == "dry-run" and self._model_result.get("choice"):
            apply_setting(self.controller, self.gpus, GpuSetting.from_dict(self._model_result["choice"]), None)

    def _tune_model(self) -> dict[str, Any]:
        from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig
        from dtpo.simulation.tuning import tune_on_simulated
        from dtpo.tune.prior import model_matching

        tuner = self.tuner
        assert tuner is not None
        spec = match_power_spec(self.gpus[0].info.name)
        default_stats = tuner.stats.get(tuner.default)
        if spec is None or default_stats is None or not default_stats.measured:
            return {"choice": None, "note": f"no power model of {self.gpus[0].info.name}: nothing to predict"}
        power = default_stats.energy_per_sample_j / default_stats.time_per_sample_s / tuner.context.gpus
        spec = within_limits(spec, self.gpus[0].knob_limits())
        model = model_matching(spec, tuner.default, power)
        with tempfile.TemporaryDirectory(prefix="dtpo-tune-model-") as tmp:
            gpu = SimulatedGpu(SimulatedGpuConfig(spec.name, "observed job", counter_period_s=0.0),
                               Path(tmp) / "state.json", model=model)
            run = tune_on_simulated(gpu, self.metric, self.config.knob or "power-limit", step_w=self.config.step_w,
                                    journal_dir=Path(tmp))
        report = run.tuner.report()
        return {"choice": run.choice.as_dict(), "model": f"parametric {spec.name}, activity {model.activity:.2f}, "
                f"memory share {model.memory_fraction:.2f} (assumed), matched to {power:.0f} W per GPU measured "
                "at the default", "settings": report["settings"]}

    # -- checkpoints -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (:mod:`dtpo.session.checkpoint`): once the search holds a choice, the measured
        settings, so a resumed run holds the same choice at once instead of profiling again."""
        tuner = self.tuner
        if tuner is None or not tuner.holding or self.source != "measured":
            return {"settings": None}
        rows = [s.as_row() for s in tuner.stats.values() if s.measured]
        choice = tuner.choice.as_dict() if tuner.choice is not None else None
        return {"settings": rows, "choice": choice, "profile": dict(self.profile)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Hold the checkpoint's choice from the start (called after :meth:`on_train_start` built the tuner); the
        GPUs get it again through the knob controller, whose journal keeps their first original settings."""
        rows = state.get("settings")
        if not rows or self.tuner is None or self.controller is None:
            return
        measured = {stats.setting: stats for stats in map(SettingStats.from_row, rows)}
        held = state.get("choice")
        choice = self.tuner.start_from_profile(measured, GpuSetting.from_dict(held) if held else None)
        self._profile_checked = self._profile_saved = True
        self.profile = {**dict(state.get("profile") or {}), "resumed_from_checkpoint": True}
        if choice != self.applied:
            self._apply(choice, self.applied)

    # -- end ---------------------------------------------------------------------------------------------------

    def tuner_state(self) -> TunerState:
        """The power tuner's phase (``off`` before it is built or without GPUs): :class:`TunerStatus`."""
        return TunerState("power", self.tuner.phase.value if self.tuner is not None else "off")

    def clock_lock(self) -> ClockLock | None:
        """The SM clock of the setting applied, once applied (not in dry-run or observe mode)."""
        applying = self.controller is not None and self.controller.mode == "apply"
        if self.applied is None or not applying:
            return None
        return ClockLock(float(self.applied.sm_clock_mhz or 0.0))

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Restore the GPUs, then put the tuning report in this rank's record."""
        self.restore()
        if self.tuner is None:
            rank_record.tuning = PowerTuning(self.config.knob, self.metric.name, applied=False,
                                             note="no GPU with power knobs on this rank: nothing was tuned")
            return
        remaining = None
        if session.target_steps is not None and self.tuner.holding and self.tuner.steps:
            samples_per_step = sum(seg.samples for seg in self.tuner.segments) / self.tuner.steps
            remaining = int(max(session.target_steps - self.tuner.profiling_steps, 0) * samples_per_step)
        report = self.tuner.report(remaining)
        rank_record.tuning = PowerTuning(self.config.knob, report["metric"], applied=self.source == "measured",
                                         note=self.note, mode=self.mode, source=self.source, profile=self.profile,
                                         model=self._model_result, report=report)

    def restore(self) -> None:
        """Put the GPUs' original settings back (idempotent)."""
        if self.controller is not None:
            self.controller.__exit__(None, None, None)
            self.controller = None
