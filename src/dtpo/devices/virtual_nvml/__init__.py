"""Virtual GPUs behind the real NVML binding: dtpo's stand-in for ``libnvidia-ml.so.1``.

``vnvml.c`` (shipped with dtpo, compiled here by the system's C compiler, never downloaded) exports the NVML
functions dtpo calls, with NVML's signatures, units and return codes. Its GPUs draw the power of dtpo's
calibrated GPU model (:mod:`dtpo.devices.physics.gpu_model`) at the power limit and clock lock in force, and
keep an energy counter in millijoules that advances with wall time. State is one file shared by every
process (``<dir>/state.bin``), so a limit set by one worker is the limit ``dtpo restore`` finds after a
``kill -9``, and two processes on one virtual GPU read one counter.

Turn it on for a process and its children with ``DTPO_VIRTUAL_GPUS=<dir>`` (``dtpo virtual-gpus create``
makes the directory and prints the line): :mod:`dtpo.devices.nvml` then loads ``<dir>/libnvidia-ml.so.1``
before nvidia-ml-py looks for the library, and nvidia-ml-py, unmodified, binds to it. Other NVML programs find
it with ``LD_LIBRARY_PATH=<dir>``. Figures from a virtual GPU are never measurements: the stand-in has a
function the real library lacks (``dtpoVirtualGpuDescribe``), and dtpo labels every such GPU ``simulated``.

Step time: a CPU computes at its own pace whatever limit a virtual GPU holds. Made with ``slow_steps``, the
stand-in also answers ``dtpoVirtualGpuTimeFactor`` (the simulator's slowdown at the settings in force), and a
Session on such a GPU waits that much longer inside each step's compute, said in the record; otherwise a tuning
run on virtual GPUs trades simulated energy against real CPU time.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtpo.core.files import untrusted_reason
from dtpo.devices.base import DeviceError
from dtpo.devices.virtual_nvml import state as st

ENV = "DTPO_VIRTUAL_GPUS"
LIBRARY = "libnvidia-ml.so.1"


@dataclass(frozen=True)
class VirtualGpus:
    """A directory of virtual GPUs.

    Attributes:
        directory: Where the stand-in and its state live (``DTPO_VIRTUAL_GPUS``).
        gpu: The GPU model's canonical name.
        count: How many GPUs.
    """

    directory: Path
    gpu: str
    count: int

    @property
    def state_path(self) -> Path:
        """The shared state file."""
        return self.directory / st.STATE_FILE

    @property
    def library(self) -> Path:
        """The compiled stand-in."""
        return self.directory / LIBRARY

    @property
    def call_log(self) -> Path:
        """One line per NVML call (``pid function gpu args return-code``) when made with ``log_calls``."""
        return self.directory / st.CALL_LOG

    def environ(self) -> dict[str, str]:
        """The environment that puts a process (and its children) on these GPUs."""
        return {ENV: str(self.directory)}


def requested(env: Mapping[str, str] = os.environ) -> Path | None:
    """The virtual GPUs' directory this process is asked to use (``DTPO_VIRTUAL_GPUS``), or ``None``."""
    value = env.get(ENV, "").strip()
    return Path(value) if value else None


_preloaded: dict[str, Any] = {}


def preload(env: Mapping[str, str] = os.environ) -> None:
    """Load the stand-in before nvidia-ml-py looks for ``libnvidia-ml.so.1``, when virtual GPUs are asked for.

    The dynamic loader then answers nvidia-ml-py's own ``CDLL("libnvidia-ml.so.1")`` with the library already
    loaded under that soname: the binding runs unmodified.

    Raises:
        DeviceError: ``DTPO_VIRTUAL_GPUS`` names a directory without a built stand-in.
    """
    directory = requested(env)
    if directory is None:
        return
    library = directory / LIBRARY
    if str(library) in _preloaded:
        return
    if not library.is_file() or not (directory / st.STATE_FILE).is_file():
        raise DeviceError(f"{ENV}={directory} holds no virtual GPUs: make them with `dtpo virtual-gpus create "
                          f"{directory}`")
    why = untrusted_reason(library)  # a library others could have planted would run as this user
    if why is not None:
        raise DeviceError(f"{ENV}: refusing to load {library}: {why}; make the virtual GPUs in a folder of your "
                          "own (`dtpo virtual-gpus create DIR` makes DIR private)")
    _preloaded[str(library)] = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)


def _own_function(nvml: Any, name: str) -> Any:
    """A function of the stand-in that the real NVML library does not have, or ``None`` (a real GPU, or a fake)."""
    return getattr(getattr(nvml, "nvmlLib", None), name, None)


def describe(nvml: Any, handle: Any) -> str | None:
    """What a GPU opened through NVML is, if it is a virtual one (``None`` for a real GPU)."""
    describe_fn = _own_function(nvml, "dtpoVirtualGpuDescribe")
    if describe_fn is None:
        return None
    out = ctypes.create_string_buffer(st.NOTE)
    if describe_fn(handle, out, ctypes.c_uint(st.NOTE)) != 0:
        return "virtual GPU: dtpo's NVML stand-in; simulated, not measured"
    return out.value.decode()


def time_factor(nvml: Any, handle: Any) -> float | None:
    """The stand-in's step-time factor at the settings in force, or ``None`` when it has none to give."""
    factor_fn = _own_function(nvml, "dtpoVirtualGpuTimeFactor")
    if factor_fn is None:
        return None
    factor = ctypes.c_double()
    if factor_fn(handle, ctypes.byref(factor)) != 0:
        return None
    return float(factor.value)
