"""The GPU knobs a Session holds for a run: set on this rank's GPU at the start, restored at the end."""

from __future__ import annotations

from collections.abc import Callable

from dtpo.devices.base import Device, DeviceError, KnobError
from dtpo.devices.knobs import KnobController, log_to_stderr
from dtpo.session.config import KnobConfig


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
            log_to_stderr(f"no GPU knobs: {exc}")
            return []
    return [d for d in devices if d.knob_key is not None]


def start_knobs(config: KnobConfig, gpus: list[Device], log: Callable[[str], None] = log_to_stderr
                ) -> KnobController | None:
    """Set the requested knobs on ``gpus`` and return the controller that restores them (``None``: nothing
    was requested, or there is no GPU with knobs).

    Raises:
        ConfigError: A value outside a GPU's range; GPUs changed before it are restored first.
    """
    if not config.requested:
        return None
    if not gpus:
        log("no GPU with power knobs on this rank (CPU run?); --power-limit/--sm-clock not applied")
        return None
    controller = KnobController(config.mode, log=log)
    controller.__enter__()
    try:
        for gpu in gpus:
            try:
                if config.power_limit_w is not None:
                    controller.set_power_limit(gpu, config.power_limit_w)
                if config.sm_clock_mhz is not None:
                    controller.lock_sm_clock(gpu, config.sm_clock_mhz)
            except KnobError as exc:
                log(f"{exc}; continuing without changing {gpu.info.name}")
    except BaseException:
        controller.__exit__(None, None, None)
        raise
    return controller
