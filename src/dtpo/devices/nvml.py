"""GPUs through NVML, via the ``pynvml`` module of nvidia-ml-py (imported lazily: this module imports without it).

Energy comes from the GPU's total-energy counter (Volta and later; millijoules since the driver loaded) where
there is one, else from its power polled on a background thread and integrated (:class:`PowerIntegrator`).

Which GPUs a process uses is read from ``CUDA_VISIBLE_DEVICES`` the way CUDA reads it: indices (``0,2``),
``GPU-`` UUIDs (any unique prefix), MIG ids (``MIG-<uuid>`` from R470 drivers on, ``MIG-GPU-<uuid>/<gi>/<ci>``
before), empty (no GPU) or unset (every GPU); a negative index ends the list (``-1`` hides every GPU). Unlike
CUDA, which silently stops at an id it cannot match, an unmatched id is an error: a typo must not make a rank
measure nothing, or the wrong GPU.

MIG: NVML reports energy and power only for a whole physical GPU, never for one MIG instance. A MIG instance
is therefore measured as its parent GPU (opened once however many of its instances are visible), and the
device's detail says that the figure covers the whole GPU, shared by all its MIG instances.

Indices are NVML's, in PCI bus order. CUDA numbers GPUs the same way when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or
when all GPUs are one model (its default, fastest first, breaks ties by bus id); on a node that mixes models
without it, the detail warns that an index may name a different GPU for CUDA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dtpo.devices import virtual_nvml
from dtpo.devices.base import Device, DeviceError, DeviceInfo
from dtpo.devices.integrator import PowerIntegrator
from dtpo.devices.nvml_knobs import NvmlKnobs

NOT_INSTALLED = "nvidia-ml-py is not installed (pip install 'dtpo[nvidia]')"
COUNTER_WRAP = 2**64  # NVML's energy counter is an unsigned 64-bit count of millijoules
MIG_NOTE = ("mig: MIG mode is on and NVML measures only the whole GPU, so this is the energy of the whole GPU, "
            "shared by all its MIG instances")


def _pynvml() -> Any:
    virtual_nvml.preload()  # DTPO_VIRTUAL_GPUS: the stand-in answers nvidia-ml-py's dlopen of libnvidia-ml.so.1
    try:
        import pynvml
    except ImportError:
        raise DeviceError(NOT_INSTALLED) from None
    return pynvml


def _is(nvml: Any, exc: BaseException, *kinds: str) -> bool:
    """Whether ``exc`` is one of pynvml's ``NVMLError_<kind>`` classes (absent ones are skipped)."""
    classes = [getattr(nvml, f"NVMLError_{kind}", None) for kind in kinds]
    return any(isinstance(cls, type) and isinstance(exc, cls) for cls in classes)


def _why(nvml: Any, exc: BaseException) -> str:
    """One line for an NVML failure that says what to do about it."""
    if _is(nvml, exc, "LibraryNotFound"):
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this host, or not mounted into it"
    if _is(nvml, exc, "DriverNotLoaded"):
        return "the NVIDIA driver is not loaded (NVML: Driver Not Loaded)"
    if _is(nvml, exc, "NoPermission"):
        return "no permission to query the GPU through NVML (check access to /dev/nvidia*, or the container's --gpus)"
    if _is(nvml, exc, "LibRmVersionMismatch"):
        return "NVML and the loaded driver differ in version (reload the driver or reboot after an upgrade)"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"NVML error: {text}"


def _init(nvml: Any) -> None:
    # nvmlInit is reference counted: every device holds one reference and gives it back in close().
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise DeviceError(_why(nvml, exc)) from None


def _str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class _Gpu:
    index: int
    handle: Any
    uuid: str
    model: str
    mig: bool


@dataclass(frozen=True)
class _Visible:
    gpu: _Gpu
    mig_id: str | None = None  # the MIG instance a MIG id selected
    note: str = ""


def _list_gpus(nvml: Any, lost: list[int] | None = None) -> list[_Gpu]:
    """The GPUs NVML answers for; one that has fallen off the bus (``GPU_IS_LOST``) is left out, and its index
    appended to ``lost``: one dead GPU must not leave the node's others unmeasured."""
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            if not _is(nvml, exc, "GpuIsLost"):
                raise
            if lost is not None:
                lost.append(index)
            continue
        try:
            mig = nvml.nvmlDeviceGetMigMode(handle)[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        except (nvml.NVMLError, AttributeError):  # GPUs without MIG answer NotSupported
            mig = False
        gpus.append(_Gpu(index, handle, _str(nvml.nvmlDeviceGetUUID(handle)),
                         _str(nvml.nvmlDeviceGetName(handle)), mig))
    return gpus


def _mig_instances(nvml: Any, gpus: list[_Gpu]) -> list[tuple[str, _Gpu]]:
    """(MIG UUID, parent GPU) for every MIG instance NVML shows."""
    found = []
    for gpu in gpus:
        if not gpu.mig:
            continue
        try:
            slots = nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)
        except (nvml.NVMLError, AttributeError):
            continue
        for slot in range(slots):
            try:
                child = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
                found.append((_str(nvml.nvmlDeviceGetUUID(child)), gpu))
            except nvml.NVMLError:  # an empty slot
                continue
    return found


def _match(entry: str, prefix: str, candidates: list[tuple[str, _Gpu]]) -> tuple[str, _Gpu]:
    """The (id, GPU) whose id starts with ``prefix`` (CUDA accepts any unique prefix)."""
    hits = [(uid, gpu) for uid, gpu in candidates if uid.lower().startswith(prefix.lower())]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise DeviceError(f"CUDA_VISIBLE_DEVICES entry {entry!r} is ambiguous: it matches "
                          + ", ".join(uid for uid, _ in hits))
    known = ", ".join(uid for uid, _ in candidates) or "none"
    raise DeviceError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches no GPU on this host (NVML sees: {known})")


def _resolve(nvml: Any, env: Mapping[str, str]) -> list[_Visible]:
    """The GPUs CUDA shows this process, in CUDA's order, one entry per CUDA device."""
    lost: list[int] = []
    gpus = _list_gpus(nvml, lost)
    by_index = {g.index: g for g in gpus}
    raw = env.get("CUDA_VISIBLE_DEVICES")
    mixed = len({g.model for g in gpus}) > 1 and env.get("CUDA_DEVICE_ORDER", "") != "PCI_BUS_ID"
    order_note = ("CUDA_DEVICE_ORDER is not PCI_BUS_ID on a node mixing GPU models: CUDA's index for this GPU "
                  "may differ from NVML's" if mixed else "")
    if raw is None:
        return [_Visible(g, note=order_note) for g in gpus]
    visible: list[_Visible] = []
    seen: set[str] = set()
    uuids = [(g.uuid, g) for g in gpus]
    mig_ids: list[tuple[str, _Gpu]] | None = None
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        upper = entry.upper()
        if upper.startswith("MIG-GPU-"):  # before R470: MIG-GPU-<parent uuid>/<gi>/<ci>
            gpu = _match(entry, entry[4:].split("/", 1)[0], uuids)[1]
            key, vis = entry.lower(), _Visible(gpu, mig_id=entry)
        elif upper.startswith("MIG-"):
            mig_ids = _mig_instances(nvml, gpus) if mig_ids is None else mig_ids
            key, gpu = _match(entry, entry, mig_ids)
            vis = _Visible(gpu, mig_id=entry)
        elif upper.startswith("GPU-"):
            key, gpu = _match(entry, entry, uuids)
            vis = _Visible(gpu)
        else:
            try:
                index = int(entry)
            except ValueError:
                raise DeviceError(f"CUDA_VISIBLE_DEVICES entry {entry!r} is not a GPU index, GPU- UUID or MIG- id") \
                    from None
            if index < 0:
                break  # CUDA ends the list at a negative index
            if index in lost:
                raise DeviceError(f"CUDA_VISIBLE_DEVICES names GPU {index}, which NVML reports lost (fallen off "
                                  "the bus)")
            if index not in by_index:
                raise DeviceError(f"CUDA_VISIBLE_DEVICES names GPU {index}, but NVML sees {len(gpus)} GPU(s)")
            key, vis = by_index[index].uuid, _Visible(by_index[index], note=order_note)
        if key in seen:
            raise DeviceError(f"CUDA_VISIBLE_DEVICES={raw!r} lists {entry!r} twice; CUDA rejects a repeated id")
        seen.add(key)
        visible.append(vis)
    return visible


def _detail(group: list[_Visible]) -> str:
    """The detail of one physical GPU that one or more visible CUDA devices map to."""
    gpu = group[0].gpu
    parts = [gpu.uuid]
    mig_ids = [v.mig_id for v in group if v.mig_id]
    if gpu.mig or mig_ids:
        parts.append(MIG_NOTE + (f" (this process uses {', '.join(mig_ids)})" if mig_ids else ""))
    parts += sorted({v.note for v in group if v.note})
    return "; ".join(parts)


def visible_gpus(env: Mapping[str, str] = os.environ) -> list[tuple[int, str]]:
    """The GPUs this process may use, as NVML indices, in CUDA's order.

    Args:
        env: Environment to read ``CUDA_VISIBLE_DEVICES`` (and ``CUDA_DEVICE_ORDER``) from.

    Returns:
        One ``(nvml_index, description)`` per CUDA device; the description holds the UUID, and for a MIG
        instance or a GPU in MIG mode says that NVML measures the whole GPU. Instances of one GPU repeat its index.

    Raises:
        DeviceError: NVML is unusable, or an entry of ``CUDA_VISIBLE_DEVICES`` matches no GPU.
    """
    nvml = _pynvml()
    _init(nvml)
    try:
        return [(v.gpu.index, _detail([v])) for v in _resolve(nvml, env)]
    except nvml.NVMLError as exc:
        raise DeviceError(_why(nvml, exc)) from None
    finally:
        nvml.nvmlShutdown()


class NvmlGpu(NvmlKnobs, Device):
    """One physical GPU: its energy counter if it has one (``nvml-counter``), else polled power (``nvml-polled``).

    Args:
        index: NVML index of the GPU.
        poll_interval_s: Polling period when there is no energy counter.
        detail: Text for :attr:`DeviceInfo.detail` (default: the UUID).
        clock: Monotonic clock for the polling integrator; injectable for tests.

    Attributes:
        index: NVML index.
        uuid: The GPU's UUID.
    """

    def __init__(self, index: int, poll_interval_s: float = 0.1, detail: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        nvml = _pynvml()
        _init(nvml)
        self._nvml = nvml
        self.index = index
        self._integrator: PowerIntegrator | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._wraps = 0
        label = f"gpu{index}"
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self.uuid = _str(nvml.nvmlDeviceGetUUID(self._handle))
            model = _str(nvml.nvmlDeviceGetName(self._handle))
            self.virtual = virtual_nvml.describe(nvml, self._handle)
            try:
                self._start_mj = self._last_mj = int(nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
                source = "nvml-counter"
            except nvml.NVMLError as exc:
                if not _is(nvml, exc, "NotSupported", "FunctionNotFound"):
                    raise
                source = "nvml-polled"
                try:  # fail here, with NVML's reason, rather than in the integrator's thread
                    self._read_power_w()
                except nvml.NVMLError as power_exc:
                    raise DeviceError(f"{label}: no energy counter, and power unreadable: {_why(nvml, power_exc)}") \
                        from None
                self._integrator = PowerIntegrator(self._read_power_w, poll_interval_s, clock, name=label)
                self._integrator.start()
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            raise DeviceError(f"{label}: {_why(nvml, exc)}") from None
        except DeviceError:
            nvml.nvmlShutdown()
            raise
        self.info = DeviceInfo(name=f"{label} ({model})", kind="gpu", source=source, estimated=False,
                               node_shared=False, detail=detail or self.uuid)
        if self.virtual is not None:  # never a measurement: the record says simulated
            how = "its energy counter" if source == "nvml-counter" else "power polled through NVML"
            self.info = dataclasses.replace(self.info, source="simulated", estimated=True,
                                            detail=f"{self.virtual}; read through {how}; {self.info.detail}")

    def _read_power_w(self) -> float:
        return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0

    @property
    def read_errors(self) -> int:
        """Failed power polls so far, each bridged by the integrator (0 in counter mode)."""
        return self._integrator.errors if self._integrator is not None else 0

    def energy_j(self) -> float:
        """Joules since opening.

        Raises:
            DeviceError: The counter cannot be read or went backwards, or power polls keep failing.
        """
        if self._integrator is not None:
            return self._integrator.energy_j()
        with self._lock:
            if not self._closed:
                self._read_counter()
            return (self._last_mj - self._start_mj) / 1000.0

    def _raw_counter_mj(self) -> int:
        """NVML's total-energy counter as it reads (mJ since the driver loaded).

        Raises:
            DeviceError: It cannot be read.
        """
        nvml = self._nvml
        try:
            return int(nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except nvml.NVMLError as exc:
            raise DeviceError(f"{self.info.name}: energy counter unreadable: {_why(nvml, exc)}") from None

    def _read_counter(self) -> None:
        now = self._raw_counter_mj() + self._wraps * COUNTER_WRAP
        if now < self._last_mj and self._last_mj - now > COUNTER_WRAP // 2:
            self._wraps += 1  # the 64-bit counter wrapped: count on from its top
            now += COUNTER_WRAP
        if now < self._last_mj:
            raise DeviceError(f"{self.info.name}: NVML energy counter went backwards ({self._last_mj} -> {now} mJ); "
                              "was the driver reloaded or the GPU reset?")
        self._last_mj = now

    def virtual_time_factor(self) -> float | None:
        """On a virtual GPU made with slow steps: how much longer a step takes at the settings in force than at the
        default (the simulator's slowdown); ``None`` on a real GPU or without slow steps."""
        if self.virtual is None or self._closed:
            return None
        return virtual_nvml.time_factor(self._nvml, self._handle)

    def counter_mj(self) -> int | None:
        """NVML's total-energy counter as it reads now (mJ since the driver loaded), or ``None`` without one."""
        if self._integrator is not None or self._closed:
            return None
        return self._raw_counter_mj()

    def power_w(self) -> float | None:
        """Power now in watts (NVML's reading, averaged over about a second on recent GPUs), or None if unsupported.

        Raises:
            DeviceError: NVML failed for another reason.
        """
        if self._closed:
            return None
        nvml = self._nvml
        try:
            return self._read_power_w()
        except nvml.NVMLError as exc:
            if _is(nvml, exc, "NotSupported"):
                return None
            raise DeviceError(f"{self.info.name}: power unreadable: {_why(nvml, exc)}") from None

    def close(self) -> None:
        """Stop polling, take a last reading, and give back this device's NVML reference. Idempotent."""
        if self._integrator is not None:
            self._integrator.stop()
        with self._lock:
            if self._closed:
                return
            if self._integrator is None:
                with contextlib.suppress(DeviceError):  # else the last good reading stands
                    self._read_counter()
            self._closed = True
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def open_nvml_gpus(local_rank: int | None = None, poll_interval_s: float = 0.1,
                   env: Mapping[str, str] | None = None) -> list[NvmlGpu]:
    """Open the GPUs this process measures.

    Args:
        local_rank: This rank's index on its node. When several GPUs are visible, only visible GPU
            ``local_rank % count`` is opened: each rank measures the GPU it uses. ``None`` opens them all.
        poll_interval_s: Polling period for GPUs without an energy counter.
        env: Environment to read ``CUDA_VISIBLE_DEVICES`` from (default: ``os.environ``).

    Returns:
        One device per physical GPU (visible MIG instances of one GPU share it).

    Raises:
        DeviceError: With one line: nvidia-ml-py missing, no driver, no permission, no GPU, or a bad id.
    """
    env = os.environ if env is None else env
    nvml = _pynvml()
    _init(nvml)
    try:
        visible = _resolve(nvml, env)
        if not visible:
            raw = env.get("CUDA_VISIBLE_DEVICES")
            raise DeviceError("NVML sees no GPU on this host" if raw is None
                              else f"no GPU visible to this process (CUDA_VISIBLE_DEVICES={raw!r})")
        if local_rank is not None and len(visible) > 1:
            visible = [visible[local_rank % len(visible)]]
        groups: dict[int, list[_Visible]] = {}
        for vis in visible:
            groups.setdefault(vis.gpu.index, []).append(vis)
        opened: list[NvmlGpu] = []
        try:
            for index, group in groups.items():
                opened.append(NvmlGpu(index, poll_interval_s, detail=_detail(group)))
        except DeviceError:
            for device in opened:
                device.close()
            raise
        return opened
    except nvml.NVMLError as exc:
        raise DeviceError(_why(nvml, exc)) from None
    finally:
        nvml.nvmlShutdown()


def open_nvml_by_uuid(uuid: str) -> NvmlGpu:
    """Open the physical GPU with this UUID, whatever its index now (used to restore journaled knobs)."""
    nvml = _pynvml()
    _init(nvml)
    try:
        match = next((g for g in _list_gpus(nvml) if g.uuid == uuid), None)
    except nvml.NVMLError as exc:
        raise DeviceError(f"cannot list GPUs: {_why(nvml, exc)}") from None
    finally:
        nvml.nvmlShutdown()
    if match is None:
        raise DeviceError(f"no GPU with UUID {uuid} on this machine")
    return NvmlGpu(match.index, detail=match.uuid)
