"""Hands a virtual GPU's simulated slowdown to the Session (see :mod:`dtpo.session.loop.slowdown`)."""

from __future__ import annotations

import logging
from typing import Any

from dtpo.core.callbacks import Callback
from dtpo.core.steps import RunView
from dtpo.devices.base import Device
from dtpo.session.loop.slowdown import ComputeSlowdown

log = logging.getLogger(__name__)

NOTE = ("step time: includes a simulated delay inside compute, the virtual GPU's slowdown at its setting in force "
        "(dtpo virtual-gpus --slow-steps): step times and throughput are partly simulated, never measurements")


def slowed_gpu(devices: list[Device]) -> Device | None:
    """The first virtual GPU that answers a step-time factor (made with slow steps), if any."""
    for device in devices:
        reader = getattr(device, "virtual_time_factor", None)
        if reader is not None and reader() is not None:
            return device
    return None


class SlowdownCallback(Callback):
    """Sets the Session's compute slowdown from a virtual GPU at the start of training.

    Args:
        gpu: A virtual GPU made with slow steps (has ``virtual_time_factor``).
    """

    def __init__(self, gpu: Any) -> None:
        self.gpu = gpu

    def on_train_start(self, session: RunView) -> None:
        """Give a Session on the CPU (not a StepReporter: it has no backward to slow) the GPU's factor."""
        device = getattr(session, "device", None)
        if hasattr(session, "compute_slowdown") and device is not None and device.type == "cpu":
            session.compute_slowdown = ComputeSlowdown(self.gpu.virtual_time_factor)  # type: ignore[attr-defined]
