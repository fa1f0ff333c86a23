"""Making virtual GPUs: compiling the NVML stand-in, filling its state from dtpo's GPU model, injecting faults."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import shutil
import subprocess
import uuid
from importlib import resources
from pathlib import Path

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.devices.base import DeviceError
from dtpo.devices.physics.gpu_model import load_model
from dtpo.devices.physics.power_specs import PowerSpec, find_power_spec
from dtpo.devices.virtual_nvml import LIBRARY, VirtualGpus
from dtpo.devices.virtual_nvml import state as st

log = logging.getLogger(__name__)

DRIVER_VERSION = "dtpo-virtual"

# What nvidia-smi calls these boards (the name NVML returns); others are "NVIDIA <model>".
NVML_NAMES = {
    "a40": "NVIDIA A40", "v100": "Tesla V100-PCIE-32GB", "h100-sxm": "NVIDIA H100 80GB HBM3",
    "a100-sxm": "NVIDIA A100-SXM4-80GB", "p100-pcie": "Tesla P100-PCIE-16GB", "p100-sxm2": "Tesla P100-SXM2-16GB",
    "t4": "Tesla T4", "rtx6000": "Quadro RTX 6000", "a6000": "NVIDIA RTX A6000", "l4": "NVIDIA L4",
    "l40s": "NVIDIA L40S", "a100-pcie": "NVIDIA A100 80GB PCIe", "h100-pcie": "NVIDIA H100 PCIe",
    "h200": "NVIDIA H200", "b200": "NVIDIA B200",
}
# Memory clocks in MHz as NVML lists them (one memory clock per board here); others 1000 MHz.
MEMORY_CLOCKS = {"a40": 7251, "v100": 877, "h100-sxm": 2619, "a100-sxm": 1593, "p100-pcie": 715, "p100-sxm2": 715,
                 "t4": 5001, "l4": 6251, "h100-pcie": 1593, "a100-pcie": 1512, "h200": 3201}
PRE_VOLTA = ("p100",)  # no total-energy counter, no clock locks: NVML answers NOT_SUPPORTED
# The stand-in's own preset profiles of power smoothing (NVIDIA publishes no defaults): profile p floors power at
# 20 x p % of the highest power limit, ramps up at 500 W/s and down at 250 W/s after 1 s of low power.
SMOOTHING_FLOOR_STEP_PCT = 20.0
SMOOTHING_RAMP_UP_MW_PER_S = 500_000.0
SMOOTHING_RAMP_DOWN_MW_PER_S = 250_000.0
SMOOTHING_HYSTERESIS_MS = 1000.0
SMOOTHING_FLOOR_RANGE_PCT = (0.0, 90.0)
MIG_CAPABLE = ("a100", "a30", "h100", "h200", "b200")


def compiler() -> str:
    """The system C compiler: ``$CC``, else ``cc``, ``gcc`` or ``clang``.

    Raises:
        DeviceError: None is installed.
    """
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise DeviceError("virtual GPUs need a C compiler to build their NVML stand-in: install gcc (or set CC)")


def build_library(directory: Path) -> Path:
    """Compile the stand-in into ``directory/libnvidia-ml.so.1`` (its soname, so NVML programs find it).

    Raises:
        DeviceError: No compiler, or the build failed (the compiler's first error line is in the message).
    """
    source = resources.files("dtpo.devices.virtual_nvml")
    with resources.as_file(source / "vnvml.c") as c_file, resources.as_file(source / "state.h") as header:
        out = directory / LIBRARY
        tmp = directory / (LIBRARY + ".tmp")
        cmd = [compiler(), "-O2", "-std=c11", "-Wall", "-Wextra", "-shared", "-fPIC", f"-I{header.parent}",
               f"-Wl,-soname,{LIBRARY}", "-o", str(tmp), str(c_file), "-lpthread"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
        raise DeviceError(f"building the NVML stand-in failed: {first}")
    os.replace(tmp, out)
    return out


def _key(spec: PowerSpec) -> str:
    return spec.name.lower()


def _flags(spec: PowerSpec) -> int:
    key = _key(spec)
    flags = 0 if key.startswith(PRE_VOLTA) else st.HAS_ENERGY_COUNTER | st.HAS_LOCKED_CLOCKS
    return flags | (st.HAS_MIG if key.startswith(MIG_CAPABLE) else 0)


def _fill_smoothing(gpu: st.GpuState) -> None:
    """Give a GPU power smoothing (off, profile 0 active), with the stand-in's preset profiles."""
    gpu.flags |= st.HAS_POWER_SMOOTHING
    gpu.smoothing_min_floor_pct, gpu.smoothing_max_floor_pct = SMOOTHING_FLOOR_RANGE_PCT
    for profile in range(st.SMOOTHING_PROFILES):
        gpu.smoothing_params[profile][:] = (SMOOTHING_FLOOR_STEP_PCT * profile, SMOOTHING_RAMP_UP_MW_PER_S,
                                            SMOOTHING_RAMP_DOWN_MW_PER_S, SMOOTHING_HYSTERESIS_MS)


def _fill_gpu(gpu: st.GpuState, spec: PowerSpec, index: int, workload: str, utilization: float,
              directory: Path) -> None:
    model = load_model(spec.name, workload)
    kind = "calibrated" if model.calibrated else "parametric"
    gpu.name = NVML_NAMES.get(_key(spec), f"NVIDIA {spec.name}").encode()
    gpu.uuid = f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'dtpo-virtual:{directory.resolve()}:{index}')}".encode()
    gpu.note = (f"virtual GPU: dtpo's NVML stand-in, power from the {kind} {spec.name} model of "
                f"{model.workload} at {utilization:.0%} busy; simulated, not measured").encode()[: st.NOTE - 1]
    gpu.flags = _flags(spec)
    gpu.min_limit_mw = int(round(spec.min_power_w * 1000))
    gpu.max_limit_mw = gpu.default_limit_mw = gpu.limit_mw = int(round(spec.max_power_w * 1000))
    gpu.mem_clock_mhz = MEMORY_CLOCKS.get(_key(spec), 1000)
    default_s = model.at().time_per_sample_s  # the default setting: the maximum limit, clocks floating
    limits = np.linspace(spec.min_power_w, spec.max_power_w, st.LIMIT_POINTS)
    gpu.n_limits = st.LIMIT_POINTS
    for i, limit in enumerate(limits):
        point = model.at(float(limit))
        gpu.limit_w[i], gpu.limit_busy_w[i], gpu.limit_clock_mhz[i] = limit, point.power_w, point.sm_clock_mhz
        gpu.limit_time_factor[i] = point.time_per_sample_s / default_s
    clocks = spec.sm_clocks_mhz[-st.MAX_CLOCKS:]
    gpu.n_clocks = len(clocks)
    for i, clock in enumerate(clocks):
        point = model.at(None, clock)
        gpu.clocks_mhz[i] = clock
        gpu.clock_busy_w[i] = point.power_w
        gpu.clock_time_factor[i] = point.time_per_sample_s / default_s
    gpu.idle_w = spec.idle_power_w
    gpu.utilization = utilization
    gpu.slow_factor = 1.0  # no straggler fault


def create(directory: str | Path, gpu: str = "A40", count: int = 1, workload: str = "resnet50",
           root: bool = False, utilization: float = 1.0, log_calls: bool = False,
           slow_steps: bool = False, power_smoothing: bool = False) -> VirtualGpus:
    """Build the stand-in and a fresh state of ``count`` virtual GPUs in ``directory``.

    Args:
        directory: Created if missing; an earlier state there is replaced (its settings and counters reset).
        gpu: GPU model (a name :func:`dtpo.devices.physics.power_specs.find_power_spec` knows; NVIDIA only).
        count: GPUs, 1-16.
        workload: The workload whose power the GPUs draw (a workload of the GPU model's traces, or any for the
            parametric model).
        root: Allow the setters (power limit, clock locks), as root may; otherwise they answer NO_PERMISSION.
        utilization: Share of the time the GPUs are busy (0-1): power = idle + utilization x (busy - idle).
        log_calls: Append every NVML call to ``calls.log`` beside the state (for tests and debugging).
        slow_steps: Let dtpo slow each training step on these GPUs by the simulator's slowdown at the setting in
            force (a delay inside compute, labelled in the record), so a tuning run trades time as on a real GPU.
        power_smoothing: Give the GPUs NVML's power smoothing (GB200's floor and ramp limits; off at the start),
            whatever their model; without it they answer NOT_SUPPORTED, as GPUs before GB200 do.

    Raises:
        ConfigError: A bad argument (one line).
        DeviceError: The stand-in could not be built.
    """
    spec = find_power_spec(gpu)
    if spec.name.upper().startswith("MI"):
        raise ConfigError(f"{spec.name} is an AMD GPU: NVML does not manage it, so it cannot be a virtual NVML GPU")
    if isinstance(count, bool) or not 1 <= int(count) <= st.MAX_GPUS:
        raise ConfigError(f"virtual GPU count must be 1-{st.MAX_GPUS}, got {count!r}")
    if not 0.0 <= utilization <= 1.0:
        raise ConfigError(f"utilization must be between 0 and 1, got {utilization:g}")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    build_library(path)
    state = st.State(magic=st.MAGIC, version=st.VERSION, count=int(count), root=int(root),
                     log_calls=int(log_calls), slow_steps=int(slow_steps), driver_version=DRIVER_VERSION.encode())
    for index in range(int(count)):
        _fill_gpu(state.gpus[index], spec, index, workload, utilization, path)
        if power_smoothing:
            _fill_smoothing(state.gpus[index])
    (path / st.CALL_LOG).unlink(missing_ok=True)
    st.write_new(path / st.STATE_FILE, state)
    _check_layout(path / LIBRARY)
    log.debug("virtual GPUs: %d x %s in %s (%s)", count, spec.name, path, "root" if root else "no permission to set")
    return VirtualGpus(path, spec.name, int(count))


def _check_layout(library: Path) -> None:
    lib = ctypes.CDLL(str(library))
    lib.dtpoVirtualGpuStateSize.restype = ctypes.c_ulonglong
    if lib.dtpoVirtualGpuStateSize() != ctypes.sizeof(st.State):
        raise DeviceError("the NVML stand-in and dtpo disagree on the state layout (a bug: state.h and state.py)")


def inject(directory: str | Path, index: int, *, lost: bool | None = None, lose_after_reads: int | None = None,
           energy_offset_mj: int | None = None, slow_factor: float | None = None) -> None:
    """Inject a fault into virtual GPU ``index``, seen by every process at its next NVML call.

    Args:
        directory: The virtual GPUs' directory.
        index: Which GPU.
        lost: Make the GPU answer ``GPU_IS_LOST`` to every call (or answer again, with ``False``).
        lose_after_reads: Lose it after this many more power or energy reads (all processes together).
        energy_offset_mj: Added to its energy counter, modulo 2**64 (a value near 2**64 makes it wrap, a jump
            below the last reading makes it go backwards).
        slow_factor: Make it a persistent straggler (a throttled or older GPU): its step-time factor
            (``dtpoVirtualGpuTimeFactor``) is multiplied by this, on top of the setting's own; 1 clears it. Its
            power stays that of the setting. Needs GPUs made with ``slow_steps``.

    Raises:
        ConfigError: No such GPU or directory, a slow factor that is not a finite number of 1 or more, or one
            for GPUs made without slow steps.
    """
    # the state holds a 32-bit float: a finite double beyond its range would be stored as infinity
    if slow_factor is not None and not (math.isfinite(ctypes.c_float(slow_factor).value) and slow_factor >= 1.0):
        raise ConfigError(f"the slow factor must be a finite number of 1 or more (1: normal speed), got {slow_factor}")
    path = Path(directory) / st.STATE_FILE
    try:
        with st.locked(path) as state:
            if not 0 <= index < state.count:
                raise ConfigError(f"no virtual GPU {index} in {directory} (it has {state.count})")
            if slow_factor is not None and not state.slow_steps:
                raise ConfigError(f"--slow needs virtual GPUs made with --slow-steps; those in {directory} were not "
                                  f"(make them again with `dtpo virtual-gpus create {directory} --slow-steps`)")
            gpu = state.gpus[index]
            if lost is not None:
                gpu.lost = int(lost)
            if lose_after_reads is not None:
                gpu.lose_after_reads = gpu.reads + int(lose_after_reads)
            if energy_offset_mj is not None:
                gpu.energy_offset_mj = int(energy_offset_mj) % 2**64
            if slow_factor is not None:
                gpu.slow_factor = float(slow_factor)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"no virtual GPUs in {directory}: {exc}") from None


