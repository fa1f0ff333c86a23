"""Let Zeus's own ``GlobalPowerLimitOptimizer`` drive a dtpo :class:`SimulatedGpu`, unchanged.

Zeus (``pip install zeus==0.16.0``) talks to NVIDIA GPUs through ``pynvml`` inside ``zeus.device.gpu.nvidia``
and measures with ``ZeusMonitor`` (``zeus.monitor.energy``), which reads the wall clock (``time.time``) and
NVML's cumulative energy counter (``nvmlDeviceGetTotalEnergyConsumption``, Volta and newer). Zeus's own tests
swap that ``pynvml`` for a mock; :class:`ZeusOnSimulatedGpu` does the same with a :class:`FakeNvml` whose
power-limit range, power limit, energy counter, name, architecture and persistence mode are the simulated
GPU's, and points the monitor's clock at the GPU's simulated clock (``gpu.now_s``). Everything above that
boundary (state machine, measurement windows, selectors) is Zeus's unmodified code.

Besides, for the time of a run:

* ``zeus.device.gpu.nvml_is_available`` answers True (as in Zeus's tests), and Zeus's GPU, CPU and SoC
  singletons are reset so every run opens its own GPU; ``CUDA_VISIBLE_DEVICES`` and the ``ZEUSD_*`` variables
  are hidden so Zeus sees exactly one GPU through NVML;
* the monitor's ``sync_execution`` (``torch.cuda.synchronize``) is a no-op: a simulated step is synchronous;
* the ``atexit`` handler Zeus registers (which puts the maximum limit back) is caught and run when the run
  closes, while the fake NVML is still in place, so nothing is left to fail at interpreter exit.

:func:`run_zeus` is the training loop: ``on_step_begin``, one simulated step, ``on_step_end``, until Zeus's
state machine is ``Done``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pynvml

from dtpo.devices.simulated import SimulatedGpu

log = logging.getLogger(__name__)

# NVML architecture by GPU; anything else is taken as Ampere (Zeus only asks whether it is Volta or newer).
ARCHITECTURES = {"V100": pynvml.NVML_DEVICE_ARCH_VOLTA, "A40": pynvml.NVML_DEVICE_ARCH_AMPERE,
                 "A100": pynvml.NVML_DEVICE_ARCH_AMPERE, "H100": pynvml.NVML_DEVICE_ARCH_HOPPER}
HIDDEN_ENV = ("CUDA_VISIBLE_DEVICES", "ZEUSD_SOCK_PATH", "ZEUSD_HOST_PORT", "ZEUSD_TOKEN")


class FakeNvml:
    """Stands in for the ``pynvml`` module inside ``zeus.device.gpu.nvidia``: one GPU, the simulated one.

    Constants and error classes are the real ``pynvml``'s; an NVML function this class does not simulate raises
    ``AttributeError`` naming it, so a Zeus code path the benchmark did not foresee fails loudly.

    Args:
        gpu: The simulated GPU behind handle 0.
    """

    HANDLE = "simulated-gpu-0"

    def __init__(self, gpu: SimulatedGpu) -> None:
        self.gpu = gpu
        self.persistence = pynvml.NVML_FEATURE_DISABLED

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            raise AttributeError(f"the fake NVML does not simulate {name}")
        return getattr(pynvml, name)

    def _check(self, handle: object) -> None:
        if handle != self.HANDLE:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlInit(self) -> None:  # noqa: N802 (NVML's names)
        """Nothing to initialise."""

    def nvmlShutdown(self) -> None:  # noqa: N802
        """Nothing to shut down."""

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        """One GPU."""
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802
        """The handle of GPU 0."""
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.HANDLE

    def nvmlDeviceGetC2cModeInfoV(self, handle: object) -> Any:  # noqa: N802
        """Not a Grace Hopper chip: NVML says not supported."""
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetName(self, handle: object) -> str:  # noqa: N802
        """e.g. ``"NVIDIA A40 (simulated)"``."""
        self._check(handle)
        return f"NVIDIA {self.gpu.model.spec.name} (simulated)"

    def nvmlDeviceGetArchitecture(self, handle: object) -> int:  # noqa: N802
        """Volta or newer, so Zeus measures with the energy counter."""
        self._check(handle)
        return ARCHITECTURES.get(self.gpu.model.spec.name, pynvml.NVML_DEVICE_ARCH_AMPERE)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: object) -> tuple[int, int]:  # noqa: N802
        """``(min, max)`` power limit in mW."""
        self._check(handle)
        limits = self.gpu.knob_limits()
        return round(limits.min_power_limit_w * 1000), round(limits.max_power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: object) -> int:  # noqa: N802
        """The default limit in mW."""
        self._check(handle)
        return round(self.gpu.knob_limits().default_power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle: object) -> int:  # noqa: N802
        """The limit in force in mW."""
        self._check(handle)
        return round(self.gpu.knob_state().power_limit_w * 1000)

    def nvmlDeviceSetPowerManagementLimit(self, handle: object, limit_mw: int) -> None:  # noqa: N802
        """Set the simulated GPU's limit (mW); out of range is NVML's invalid argument."""
        self._check(handle)
        limits = self.gpu.knob_limits()
        if not limits.min_power_limit_w * 1000 <= limit_mw <= limits.max_power_limit_w * 1000:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.gpu.set_power_limit(limit_mw / 1000.0)

    def nvmlDeviceGetPersistenceMode(self, handle: object) -> int:  # noqa: N802
        """``NVML_FEATURE_ENABLED`` once Zeus turned it on."""
        self._check(handle)
        return self.persistence

    def nvmlDeviceSetPersistenceMode(self, handle: object, mode: int) -> None:  # noqa: N802
        """Remember the mode (it changes nothing in the simulation)."""
        self._check(handle)
        self.persistence = mode

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:  # noqa: N802
        """The simulated energy counter in whole mJ, as NVML reports it."""
        self._check(handle)
        return int(self.gpu.energy_j() * 1000.0)


class _AtexitTrap:
    """Replaces ``atexit`` in ``zeus.optimizer.power_limit``: keeps the handlers so the run can call them."""

    def __init__(self) -> None:
        self.handlers: list[Callable[[], Any]] = []

    def register(self, handler: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """Keep ``handler`` (with its arguments) for :meth:`run`."""
        self.handlers.append(lambda: handler(*args, **kwargs))
        return handler

    def run(self) -> None:
        """Call the handlers, last registered first, as ``atexit`` would; a failure is logged, not raised."""
        while self.handlers:
            handler = self.handlers.pop()
            try:
                handler()
            except Exception:  # a handler must not end the benchmark, as at interpreter exit
                log.exception("Zeus's exit handler failed")


class ZeusOnSimulatedGpu:
    """Context manager: for its duration, Zeus's NVIDIA layer and monitor clock are the simulated GPU's.

    Args:
        gpu: The simulated GPU Zeus will see as GPU 0.
    """

    def __init__(self, gpu: SimulatedGpu) -> None:
        self.gpu = gpu
        self.nvml = FakeNvml(gpu)
        self.atexit = _AtexitTrap()
        self._stack = ExitStack()

    def __enter__(self) -> ZeusOnSimulatedGpu:
        import zeus.device.cpu
        import zeus.device.gpu
        import zeus.device.soc
        import zeus.monitor.energy
        import zeus.optimizer.power_limit

        stack = self._stack
        stack.enter_context(mock.patch.dict(os.environ))
        for name in HIDDEN_ENV:
            os.environ.pop(name, None)
        stack.enter_context(mock.patch("zeus.device.gpu.nvidia.pynvml", self.nvml))
        stack.enter_context(mock.patch.object(zeus.device.gpu, "nvml_is_available", lambda: True))
        stack.enter_context(mock.patch.object(zeus.device.gpu, "_gpus", None))
        stack.enter_context(mock.patch.object(zeus.device.cpu, "_cpus", None))
        stack.enter_context(mock.patch.object(zeus.device.soc, "_soc", None))
        stack.enter_context(mock.patch.object(zeus.monitor.energy, "time", lambda: self.gpu.now_s))
        stack.enter_context(mock.patch.object(zeus.monitor.energy, "sync_execution_fn", lambda *a, **k: None))
        stack.enter_context(mock.patch.object(zeus.optimizer.power_limit, "atexit", self.atexit))
        for device in zeus.device.gpu.get_gpus().gpus:
            device._disable_sys_admin_warning = True  # as Zeus's tests do: no SYS_ADMIN warning
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.atexit.run()  # what Zeus does at interpreter exit: the maximum limit back
        finally:
            self._stack.close()


@dataclass
class ZeusRun:
    """What Zeus did on one simulated GPU.

    Attributes:
        choice_w: The power limit Zeus chose (W).
        profiling_steps: Steps run before Zeus reached ``Done`` (the step that follows runs at ``choice_w``).
        profile_time_s: Simulated seconds of those steps.
        profile_energy_j: Joules of those steps, as the energy counter read them.
        limits_w: The power limit in force at each of those steps.
        measurements: Zeus's own measurement per profiled limit: ``(limit_w, time_s, energy_j)`` of its window.
    """

    choice_w: float
    profiling_steps: int
    profile_time_s: float
    profile_energy_j: float
    limits_w: list[float] = field(default_factory=list)
    measurements: list[tuple[float, float, float]] = field(default_factory=list)


def run_zeus(gpu: SimulatedGpu, selector: Any, max_steps: int = 100_000) -> ZeusRun:
    """Train on ``gpu`` under Zeus's ``GlobalPowerLimitOptimizer`` (its defaults) until it is ``Done``.

    Args:
        gpu: A fresh simulated GPU (clock and counter at 0, maximum limit).
        selector: A Zeus optimum selector, e.g. ``zeus.optimizer.power_limit.Energy()``.
        max_steps: Give up (``RuntimeError``) after this many steps.
    """
    from zeus.monitor import ZeusMonitor
    from zeus.optimizer.power_limit import Done, GlobalPowerLimitOptimizer

    with ZeusOnSimulatedGpu(gpu):
        plo = GlobalPowerLimitOptimizer(ZeusMonitor(gpu_indices=[0]), optimum_selector=selector)
        start_time_s, start_energy_j = gpu.now_s, gpu.energy_j()
        limits: list[float] = []
        while True:
            plo.on_step_begin()
            if isinstance(plo.state, Done):
                break
            if len(limits) >= max_steps:
                raise RuntimeError(f"Zeus did not finish profiling within {max_steps} steps")
            limits.append(gpu.knob_state().power_limit_w)
            times, powers = gpu.sample_steps(1)
            gpu.advance(times, powers)
            plo.on_step_end()
        choice_w = plo.state.optimal_power_limit / 1000.0
        if gpu.knob_state().power_limit_w != choice_w:
            raise RuntimeError(f"Zeus chose {choice_w:g} W but the GPU is at {gpu.knob_state().power_limit_w:g} W")
        return ZeusRun(
            choice_w=choice_w, profiling_steps=len(limits), profile_time_s=gpu.now_s - start_time_s,
            profile_energy_j=gpu.energy_j() - start_energy_j, limits_w=limits,
            measurements=[(float(m.power_limit), m.time, m.energy) for m in plo.measurements])
