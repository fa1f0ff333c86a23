"""Test doubles shared by the test suite: one fake pynvml module and one fake GPU device.

``FakeNvml`` is just enough of pynvml for the NVML backend and its knobs: energy counter and power, MIG,
power-limit and clock knobs, and the errors pynvml raises. Every handle is the :class:`FakeNvmlGpu` (or
:class:`FakeMig`) itself; every knob call is logged in order in ``FakeNvml.calls``. ``FakeGpu`` is a
:class:`dtpo.devices.base.Device` with knobs held in memory, for code above the devices layer.

Import with ``from fakes import FakeGpu, FakeNvml`` (``tests/`` is on the path, as for ``conftest``).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path

from dtpo.devices.base import Device, DeviceInfo, KnobError, KnobLimits, KnobState


class NVMLError(Exception):
    """pynvml's error, with its numeric ``value`` and pynvml's messages."""

    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 4: "Insufficient Permissions", 6: "Not Found", 9: "Driver Not Loaded",
                12: "NVML Shared Library Not Found", 15: "GPU is lost"}.get(self.value, "Unknown Error")


def _error(name: str, value: int) -> type[NVMLError]:
    return type(f"NVMLError_{name}", (NVMLError,), {"__init__": lambda self: NVMLError.__init__(self, value)})


@dataclass
class FakeMig:
    """A MIG instance: only its UUID."""

    uuid: str


@dataclass
class FakeNvmlGpu:
    """One GPU as the fake pynvml sees it."""

    uuid: str
    model: str = "NVIDIA H100 80GB HBM3"
    energy_mj: int | None = 1_000_000  # None: no energy counter (pre-Volta)
    power_mw: int = 300_000
    mig: list[FakeMig] = field(default_factory=list)
    fail_power: bool = False
    fail_handle: type[NVMLError] | None = None
    limit_mw: int = 300_000
    limit_range_mw: tuple[int, int] = (100_000, 300_000)
    default_limit_mw: int = 300_000
    graphics_clocks: tuple[int, ...] = (1740, 1725, 1710, 1200, 210)
    locked: tuple[int, int] | None = None


class FakeNvml(types.ModuleType):
    """Just enough of pynvml, over a list of :class:`FakeNvmlGpu`.

    Args:
        gpus: The GPUs it shows.
        journal_path: A knob journal whose existence is noted at every knob change (``journal_seen_at_set``).

    Attributes:
        calls: Every knob call, in order (``("get_limit",)``, ``("set_limit", mw)``, ``("lock", lo, hi)``,
            ``("unlock",)``).
        deny: Make every knob change fail with ``NVMLError_NoPermission``.
        init_error: Raised by ``nvmlInit``.
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = _error("NotSupported", 3)
    NVMLError_NoPermission = _error("NoPermission", 4)
    NVMLError_NotFound = _error("NotFound", 6)
    NVMLError_DriverNotLoaded = _error("DriverNotLoaded", 9)
    NVMLError_LibraryNotFound = _error("LibraryNotFound", 12)
    NVMLError_GpuIsLost = _error("GpuIsLost", 15)
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus: list[FakeNvmlGpu], journal_path: Path | None = None) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.refs = 0
        self.init_error: NVMLError | None = None
        self.calls: list[tuple[object, ...]] = []
        self.deny = False
        self.journal_path = journal_path
        self.journal_seen_at_set: list[bool] = []

    # -- discovery and energy ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.refs += 1

    def nvmlShutdown(self) -> None:
        assert self.refs > 0, "nvmlShutdown without nvmlInit"
        self.refs -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvmlGpu:
        gpu = self.gpus[index]
        if gpu.fail_handle is not None:
            raise gpu.fail_handle()
        return gpu

    def nvmlDeviceGetUUID(self, handle: FakeNvmlGpu | FakeMig) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeNvmlGpu) -> bytes:
        return handle.model.encode()  # old pynvml returns bytes

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeNvmlGpu) -> int:
        if handle.energy_mj is None:
            raise self.NVMLError_NotSupported()
        return handle.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: FakeNvmlGpu) -> int:
        if handle.fail_power:
            raise self.NVMLError_GpuIsLost()
        return handle.power_mw

    def nvmlDeviceGetMigMode(self, handle: FakeNvmlGpu) -> list[int]:
        if not handle.mig:
            raise self.NVMLError_NotSupported()
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeNvmlGpu) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeNvmlGpu, index: int) -> FakeMig:
        if index >= len(handle.mig):
            raise self.NVMLError_NotFound()
        return handle.mig[index]

    # -- knobs ------------------------------------------------------------------------------------------

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeNvmlGpu) -> tuple[int, int]:
        return handle.limit_range_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeNvmlGpu) -> int:
        return handle.default_limit_mw

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: FakeNvmlGpu) -> list[int]:
        return [7251, 405]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: FakeNvmlGpu, memory_mhz: int) -> list[int]:
        return list(handle.graphics_clocks) if memory_mhz == 7251 else [min(handle.graphics_clocks)]

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeNvmlGpu) -> int:
        self.calls.append(("get_limit",))
        return handle.limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeNvmlGpu, mw: int) -> None:
        self._change("set_limit", mw)
        handle.limit_mw = mw

    def nvmlDeviceSetGpuLockedClocks(self, handle: FakeNvmlGpu, lo: int, hi: int) -> None:
        self._change("lock", lo, hi)
        handle.locked = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(self, handle: FakeNvmlGpu) -> None:
        self._change("unlock")
        handle.locked = None

    def _change(self, *call: object) -> None:
        if self.deny:
            raise self.NVMLError_NoPermission()
        if self.journal_path is not None:
            self.journal_seen_at_set.append(self.journal_path.exists())
        self.calls.append(call)


class FakeGpu(Device):
    """A GPU with knobs held in memory; ``deny`` makes every change fail for want of permission.

    Args:
        name: Its name (and knob key ``fake:<name>``).
        deny: Refuse every knob change as a driver without permission would.
    """

    def __init__(self, name: str = "gpu0", deny: bool = False) -> None:
        self.info = DeviceInfo(name, "gpu", "nvml-counter", False, False)
        self.state = KnobState(300.0, None)
        self.deny = deny
        self.calls: list[str] = []

    def energy_j(self) -> float:
        return 0.0

    @property
    def knob_key(self) -> str | None:
        return f"fake:{self.info.name}"

    def knob_limits(self) -> KnobLimits | None:
        return KnobLimits(100.0, 300.0, 300.0, (900, 1200, 1500))

    def knob_state(self) -> KnobState:
        return self.state

    def set_power_limit(self, watts: float) -> None:
        self._check()
        self.calls.append(f"limit {watts:g}")
        self.state = KnobState(watts, self.state.locked_sm_clocks_mhz)

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        self._check()
        self.calls.append(f"lock {min_mhz}-{max_mhz}")
        self.state = KnobState(self.state.power_limit_w, (min_mhz, max_mhz))

    def unlock_sm_clocks(self) -> None:
        self._check()
        self.calls.append("unlock")
        self.state = KnobState(self.state.power_limit_w, None)

    def _check(self) -> None:
        if self.deny:
            raise KnobError(f"{self.info.name}: cannot set: Insufficient Permissions", permission=True)
