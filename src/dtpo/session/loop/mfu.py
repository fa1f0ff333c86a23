"""Model FLOPs utilisation: the model's FLOPs per step, and the device's peak.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` over the first step's forward and backward.
The peak comes from the datasheet catalogue on GPUs. On CPUs it is measured on the threads this process
uses, the way the step's matrix products actually run: for a mixed precision, ``torch.mm`` and
``F.linear`` of float32 inputs under ``torch.autocast("cpu", dtype)`` (as the model's forward) and
``torch.mm`` of tensors already in the dtype (as parts of backward); for float32, ``torch.mm`` and
``F.linear``. The best of these kernels is the peak: on many CPUs a raw float16 ``torch.mm`` is several
times slower than the oneDNN kernel autocast picks for ``F.linear``, and a peak taken from it alone put
MFU above 100 %.

Each kernel is timed in several short bursts and the best kept, so one busy moment does not lower the
peak; a measurement during which this process was visibly descheduled is used but not cached. The cache
(``cpu_peak_flops.json``) is keyed by what the figure depends on: CPU model, threads, dtype, autocast or
not, and torch version; each entry records when it was measured, by which kernel, and the machine's load
average then.

A peak measured while other work kept the CPUs busy (a test suite, another job) is too low, and every MFU
taken against it too high. So a cached peak is first held against a quick check (the same kernel timed for a
few milliseconds, :func:`quick_check`): when the check beats it by more than :data:`IMPLAUSIBLE`, the peak is
measured again. A peak measured with a load average above what this process's threads leave free is used,
cached and marked: its note says "measured under load", and the run's summary repeats it under the MFU (as
it does a re-measured peak's note). A cache another user could have written is neither read nor written
(:func:`~dtpo.core.files.untrusted_reason`): the peak is measured.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dtpo.core.files import untrusted_reason
from dtpo.core.measurement import Measurement
from dtpo.core.record import write_json_atomic
from dtpo.devices.modelled_cpu import read_cpu_model
from dtpo.devices.physics.catalogue import find_gpu, gpu_peak_flops

logger = logging.getLogger(__name__)

CACHE_FILE = "cpu_peak_flops.json"
_SIZES = (256, 512, 1024)  # matrix sizes tried, smallest first; grown while one product is quick
_QUICK_S = 0.01  # a product faster than this is timed at the next size up
_BURSTS = 5  # bursts per kernel; the best is kept
_BURST_S = 0.02  # each burst repeats the product for at least this long
_PAUSE_S = 0.005  # between bursts, so that one busy moment spoils one burst, not all
_QUIET = 0.8  # share of the wall time the timing thread must have run for a measurement to be cached
_CHECK_SIZE = 512  # the quick check's largest matrix
_CHECK_BURSTS = 3  # its bursts (the best is kept)
_CHECK_S = 0.005  # each of its bursts repeats the product for at least this long
IMPLAUSIBLE = 1.25
"""A cached peak that a quick check beats by more than this factor is measured again: a peak is the best rate
of the kernel at its best size, so a short timing of it at a size no larger should not come out above it."""
UNDER_LOAD = "measured under load"
"""In a peak's note when the CPUs were busy with other work as it was measured (the summary shows such notes)."""


def cache_dir() -> Path:
    """Where dtpo caches measured figures (``DTPO_CACHE_DIR``, else ``~/.cache/dtpo``)."""
    return Path(os.environ.get("DTPO_CACHE_DIR") or Path.home() / ".cache" / "dtpo")


def cpu_model() -> str:
    """The processor's model name (from ``/proc/cpuinfo``, else what :mod:`platform` knows)."""
    return read_cpu_model() or platform.processor() or platform.machine()


def peak_flops(device: torch.device, dtype: torch.dtype, autocast: bool | None = None) -> Measurement:
    """Peak matmul FLOP/s of ``device`` in ``dtype``, with its source.

    Args:
        device: The device the step runs on.
        dtype: The dtype its matrix products run in.
        autocast: Whether the model runs under autocast (default: for any dtype but float32).
    """
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
        return measured_cpu_peak(dtype, autocast)
    return Measurement(None, "FLOP/s", "measured", f"no peak known for {device.type}")


def cpu_peak_key(dtype: torch.dtype, autocast: bool, threads: int | None = None) -> str:
    """The cache key of a CPU peak: CPU model, threads, dtype, autocast or not, torch version."""
    threads = torch.get_num_threads() if threads is None else threads
    dtype_name = str(dtype).removeprefix("torch.")
    mode = "autocast" if autocast else "plain"
    return f"{cpu_model()}|threads={threads}|{dtype_name}|{mode}|torch={torch.__version__}"


def measured_cpu_peak(dtype: torch.dtype, autocast: bool | None = None) -> Measurement:
    """The CPU's best matmul FLOP/s for ``dtype`` on this process's threads, from the cache or measured now.

    Args:
        dtype: The dtype the step's matrix products run in.
        autocast: Whether the model runs under autocast (default: for any dtype but float32, as
            :class:`~dtpo.session.loop.precision.Precision` does).
    """
    autocast = dtype != torch.float32 if autocast is None else autocast
    threads = torch.get_num_threads()
    dtype_name = str(dtype).removeprefix("torch.")
    key = cpu_peak_key(dtype, autocast, threads)
    path = cache_dir() / CACHE_FILE
    cache = _read_cache(path)
    entry = cache.get(key) if cache is not None else None
    stale = ""
    if _valid_entry(entry):
        checked = quick_check(dtype, autocast, entry["kernel"])
        busy = busy_load(entry.get("load"), threads)
        if checked is None or checked <= IMPLAUSIBLE * entry["value"]:
            return Measurement(entry["value"], "FLOP/s", "measured",
                               f"cached from {entry['measured_at']}: best of {entry['kernel']} on {threads} "
                               f"thread(s)" + (f"; {UNDER_LOAD} ({busy})" if busy else ""))
        stale = (f"; re-measured: the cached peak ({entry['value'] / 1e9:,.1f} GFLOP/s, measured "
                 f"{entry['measured_at']}{' at ' + busy if busy else ''}) was below a quick check "
                 f"({checked / 1e9:,.1f} GFLOP/s)")
    load = load_average()
    value, kernel, quiet = _best_kernel(dtype, autocast)
    note = f"measured now: best of {kernel} on {threads} thread(s)"
    if not quiet:
        return Measurement(value, "FLOP/s", "measured",
                           f"{note}; {UNDER_LOAD} (the timing thread was descheduled), so not cached{stale}")
    if cache is not None:
        cache[key] = {"value": value, "kernel": kernel, "dtype": dtype_name, "autocast": autocast,
                      "threads": threads, "measured_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                      "load": load}
        try:
            write_json_atomic(path, cache)
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next time
    busy = busy_load(load, threads)
    return Measurement(value, "FLOP/s", "measured", note + (f"; {UNDER_LOAD} ({busy})" if busy else "") + stale)


def _read_cache(path: Path) -> dict[str, Any] | None:
    """The cached peaks (empty when there are none or the file is unreadable), or ``None`` when the cache is not
    to be trusted: another user could plant a peak there (the rule of :func:`~dtpo.core.files.untrusted_reason`)."""
    if not path.exists():
        return {}
    why = untrusted_reason(path)
    if why is not None:
        logger.warning("CPU peak cache %s is not used: %s; measuring the peak (chmod go-w the folder, or set "
                       "DTPO_CACHE_DIR to a folder of your own)", path, why)
        return None
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return cache if isinstance(cache, dict) else {}


def load_average() -> dict[str, float] | None:
    """The machine's 1-minute load average and CPU count, as a cache entry keeps them (``None`` where unknown)."""
    try:
        return {"load_1min": round(os.getloadavg()[0], 2), "cpus": float(os.cpu_count() or 1)}
    except (OSError, AttributeError):
        return None


def under_load(load_1min: float, cpus: float, threads: int) -> bool:
    """Whether other work competed for the CPUs: a load average of at least one CPU more than this process's
    threads leave free."""
    return load_1min >= max(cpus - threads, 0) + 1


def busy_load(load: Any, threads: int) -> str:
    """``"load average 3.9 on 2 CPUs"`` when a :func:`load_average` says other work competed for the CPUs, else
    ``""``."""
    if not isinstance(load, dict) or not all(isinstance(load.get(k), int | float) for k in ("load_1min", "cpus")):
        return ""
    if not under_load(load["load_1min"], load["cpus"], threads):
        return ""
    return f"load average {load['load_1min']:g} on {load['cpus']:g} CPUs"


def quick_check(dtype: torch.dtype, autocast: bool, kernel: str) -> float | None:
    """A short timing of a cached peak's kernel (``"float32 mm 1024x1024"``): its best FLOP/s over a few
    millisecond bursts at its size or :data:`_CHECK_SIZE`, whichever is smaller (``None`` for a kernel this
    dtype does not run)."""
    name, _, size = kernel.rpartition(" ")
    build = cpu_kernels(dtype, autocast).get(name)
    if build is None or not size.partition("x")[0].isdigit():
        return None
    n = min(int(size.partition("x")[0]), _CHECK_SIZE)
    try:
        run = build(n)
        run()  # the first call pays for kernel selection
        return max(_burst_rate(run, n, _CHECK_S)[0] for _ in range(_CHECK_BURSTS))
    except RuntimeError:
        return None


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    value = entry.get("value")
    return (isinstance(value, int | float) and math.isfinite(value) and value > 0
            and isinstance(entry.get("measured_at"), str) and isinstance(entry.get("kernel"), str))


def cpu_kernels(dtype: torch.dtype, autocast: bool) -> dict[str, Callable[[int], Callable[[], Any]]]:
    """The matrix products a step in ``dtype`` runs, by name; each builds, for a size n, one n^3 product."""
    dtype_name = str(dtype).removeprefix("torch.")

    def raw_mm(n: int) -> Callable[[], Any]:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        return lambda: torch.mm(a, b)

    def autocast_op(op: Callable[[torch.Tensor, torch.Tensor], Any]) -> Callable[[int], Callable[[], Any]]:
        def build(n: int) -> Callable[[], Any]:
            a, b = torch.randn(n, n), torch.randn(n, n)

            def run() -> Any:
                with torch.autocast("cpu", dtype=dtype):
                    return op(a, b)
            return run
        return build

    def raw_linear(n: int) -> Callable[[], Any]:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        return lambda: F.linear(a, b)

    if not autocast:
        return {f"{dtype_name} mm": raw_mm, f"{dtype_name} linear": raw_linear}
    return {f"{dtype_name} mm": raw_mm, f"autocast {dtype_name} mm": autocast_op(torch.mm),
            f"autocast {dtype_name} linear": autocast_op(F.linear)}


def _best_kernel(dtype: torch.dtype, autocast: bool) -> tuple[float, str, bool]:
    """The fastest of :func:`cpu_kernels`: (FLOP/s, ``"<kernel> NxN"``, whether the CPU looked quiet)."""
    best = (0.0, "", True)
    for name, build in cpu_kernels(dtype, autocast).items():
        try:
            value, n, quiet = _time_kernel(build)
        except RuntimeError:  # a dtype this CPU build cannot multiply in
            continue
        if value > best[0]:
            best = (value, f"{name} {n}x{n}", quiet)
    if best[0] <= 0:
        raise RuntimeError(f"no matrix product in {dtype} could be timed on this CPU")
    return best


def _time_kernel(build: Callable[[int], Callable[[], Any]]) -> tuple[float, int, bool]:
    """Best FLOP/s of one kernel over several bursts: (FLOP/s, size, whether this thread ran undisturbed)."""
    n = _SIZES[0]
    for size in _SIZES:
        n = size
        run = build(n)
        run()  # the first call pays for kernel selection
        start = time.perf_counter()
        run()
        if time.perf_counter() - start >= _QUICK_S:
            break
    best, best_share = 0.0, 0.0
    for burst in range(_BURSTS):
        if burst:
            time.sleep(_PAUSE_S)
        rate, share = _burst_rate(run, n, _BURST_S)
        if rate > best:
            best, best_share = rate, share
    return best, n, best_share >= _QUIET


def _burst_rate(run: Callable[[], Any], n: int, seconds: float) -> tuple[float, float]:
    """Repeat one n^3 product for at least ``seconds``: (FLOP/s, share of the wall time this thread ran)."""
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    calls = 0
    while calls == 0 or time.perf_counter() - wall0 < seconds:
        run()
        calls += 1
    wall = time.perf_counter() - wall0
    return 2.0 * n**3 * calls / wall, (time.thread_time() - cpu0) / wall
