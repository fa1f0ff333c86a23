"""Model FLOPs utilisation: the model's FLOPs per step, and the device's peak.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` over the first step's forward and backward.
The peak comes from the datasheet catalogue on GPUs; on CPUs it is measured with a short matmul in the
run's precision on the threads this process uses, and cached per CPU model, thread count and dtype.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from dtpo.core.measurement import Measurement
from dtpo.core.record import write_json_atomic
from dtpo.devices.modelled_cpu import read_cpu_model
from dtpo.plan.catalogue import find_gpu, gpu_peak_flops

_GEMM_SIZE = 1024
_GEMM_SECONDS = 0.4


def cache_dir() -> Path:
    """Where dtpo caches measured figures (``DTPO_CACHE_DIR``, else ``~/.cache/dtpo``)."""
    return Path(os.environ.get("DTPO_CACHE_DIR") or Path.home() / ".cache" / "dtpo")


def cpu_model() -> str:
    """The processor's model name (from ``/proc/cpuinfo``, else what :mod:`platform` knows)."""
    return read_cpu_model() or platform.processor() or platform.machine()


def peak_flops(device: torch.device, dtype: torch.dtype) -> Measurement:
    """Peak matmul FLOP/s of ``device`` in ``dtype``, with its source."""
    dtype_name = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        spec = find_gpu(name)
        if spec is None:
            return Measurement(None, "FLOP/s", "datasheet", f"{name} is not in the catalogue")
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        value = gpu_peak_flops(spec, dtype_name, allow_tf32)
        return Measurement(value, "FLOP/s", "datasheet", f"{spec.name} {dtype_name} dense peak")
    if device.type == "cpu":
        return measured_cpu_peak(dtype)
    return Measurement(None, "FLOP/s", "measured", f"no peak known for {device.type}")


def measured_cpu_peak(dtype: torch.dtype) -> Measurement:
    """The CPU's matmul FLOP/s on this process's threads, measured once and cached."""
    threads = torch.get_num_threads()
    dtype_name = str(dtype).removeprefix("torch.")
    key = f"{cpu_model()}|threads={threads}|{dtype_name}|torch={torch.__version__}"
    path = cache_dir() / "cpu_peak_flops.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    note = f"measured {_GEMM_SIZE}x{_GEMM_SIZE} {dtype_name} matmul on {threads} thread(s)"
    if key in cache:
        return Measurement(cache[key], "FLOP/s", "measured", note + " (cached)")
    value = _time_gemm(dtype)
    cache[key] = value
    try:
        write_json_atomic(path, cache)
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
    return Measurement(value, "FLOP/s", "measured", note)


def _time_gemm(dtype: torch.dtype) -> float:
    """Best FLOP/s of repeated square matmuls over a short time budget."""
    n = _GEMM_SIZE
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)  # first call pays for kernel selection
    best = 0.0
    deadline = time.perf_counter() + _GEMM_SECONDS
    while time.perf_counter() < deadline or best == 0.0:
        start = time.perf_counter()
        torch.mm(a, b)
        elapsed = time.perf_counter() - start
        best = max(best, 2.0 * n**3 / elapsed)
    return best
