"""The GPU knobs a Session holds for a run: set on this rank's GPU at the start, restored at the end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as dist

from dtpo.core.callbacks import Callback
from dtpo.core.config import KnobConfig
from dtpo.core.record import RankRecord
from dtpo.core.record_sections import KnobSection
from dtpo.core.steps import RunView
from dtpo.core.tuner_status import ClockLock
from dtpo.devices.base import Device, DeviceError, KnobError, KnobLimits
from dtpo.devices.knobs import KnobController, log_knob_action


def rank_gpus(energy_devices: list[Device] | None, local_rank: int, cuda: bool) -> list[Device]:
    """This rank's GPUs with knobs: those energy measurement opened, else opened here through NVML."""
    devices = energy_devices
    if devices is None:
        if not cuda:
            return []
        try:
            from dtpo.devices.nvml import open_nvml_gpus

            devices = list(open_nvml_gpus(local_rank=local_rank))
        except DeviceError as exc:
            log_knob_action(f"no GPU knobs: {exc}")
            return []
    return [d for d in devices if d.knob_key is not None]


def _has_smoothing(gpu: Device) -> bool:
    """Whether a GPU has power smoothing (one NVML cannot tell about counts as without)."""
    try:
        return gpu.power_smoothing_limits() is not None
    except KnobError:
        return False


def start_knobs(config: KnobConfig, gpus: list[Device], log: Callable[[str], None] = log_knob_action
                ) -> KnobController | None:
    """Set the requested knobs on ``gpus`` and return the controller that restores them (``None``: nothing
    was requested, or there is no GPU with knobs).

    Raises:
        ConfigError: A value outside a GPU's range; GPUs changed before it are restored first.
    """
    if not config.requested:
        return None
    if not gpus:
        log("no GPU with power knobs on this rank (CPU run?); --power-limit/--sm-clock/--power-smoothing not applied")
        return None
    controller = KnobController(config.mode, log=log)
    controller.__enter__()
    smoothing = config.smoothing
    try:
        for gpu in gpus:
            try:
                if config.power_limit_w is not None:
                    controller.set_power_limit(gpu, config.power_limit_w)
                if config.sm_clock_mhz is not None:
                    controller.lock_sm_clock(gpu, config.sm_clock_mhz)
                if smoothing is not None:
                    controller.set_power_smoothing(gpu, smoothing)
            except KnobError as exc:
                log(f"{exc}; continuing without changing {gpu.info.name}")
    except BaseException:
        controller.__exit__(None, None, None)
        raise
    return controller


class KnobCallback(Callback):
    """Holds the configured GPU knobs for the run: set before the first step, restored when the rank stops
    (before anything else is written), on a signal, or by the next dtpo start after a crash.

    Args:
        config: The knobs to hold.
        gpus: This rank's GPUs with knobs.
    """

    def __init__(self, config: KnobConfig, gpus: list[Device]) -> None:
        self.config = config
        self.gpus = gpus
        self.controller: KnobController | None = None

    def on_train_start(self, session: RunView) -> None:
        """Set the knobs (a CPU run says once, on rank 0, that nothing was applied)."""
        if not self.gpus and session.rank != 0:
            return
        self.controller = start_knobs(self.config, self.gpus)

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Put the GPUs' original settings back and say in the record what was (not) applied."""
        controller = self.controller
        self.restore()
        requested = KnobSection(self.config.power_limit_w, self.config.sm_clock_mhz)
        if not self.gpus:
            rank_record.knobs = replace(requested, applied=False, mode=self.config.mode, gpus=[],
                                        note="no GPU with power knobs on this rank: nothing was applied")
            return
        mode = controller.mode if controller is not None else self.config.mode
        note = {"apply": "set for the run and restored at its end", "dry-run": "dry run: logged, not applied",
                "observe": "observe: not applied"}.get(mode, "")
        smoothing = self.config.smoothing
        if smoothing is not None:
            without = [gpu.info.name for gpu in self.gpus if not _has_smoothing(gpu)]
            note += f"; {smoothing.describe()}" + (f" (not on {', '.join(without)}: no power smoothing)" if without
                                                    else "")
        rank_record.knobs = replace(requested, applied=mode == "apply", mode=mode,
                                    gpus=[gpu.info.name for gpu in self.gpus], note=note)

    def tuner_state(self) -> None:
        """Fixed knobs: no tuner."""
        return None

    def clock_lock(self) -> ClockLock | None:
        """The configured SM clock, once applied."""
        applying = self.controller is not None and self.controller.mode == "apply"
        return ClockLock(float(self.config.sm_clock_mhz)) if self.config.sm_clock_mhz is not None and applying else None

    def restore(self) -> None:
        """Restore now (idempotent)."""
        if self.controller is not None:
            self.controller.__exit__(None, None, None)
            self.controller = None


def ranks_agree_on_limits(session: RunView, limits: KnobLimits | None) -> bool:
    """Whether every rank has GPU knobs with the same power-limit range (one all-reduce pair when distributed):
    ranks that choose limits must choose among the same candidates to reach the same decisions."""
    mine = [1.0, limits.min_power_limit_w, limits.max_power_limit_w] if limits is not None else [0.0, 0.0, 0.0]
    if not session.ctx.distributed:
        return bool(mine[0])
    low = torch.tensor(mine, dtype=torch.float64, device=session.ctx.collective_device)
    high = low.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=session.ctx.group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=session.ctx.group)
    return bool(low[0].item() == 1.0 and torch.equal(low, high))
