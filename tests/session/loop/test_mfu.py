"""The CPU peak: measured the way the step's matrix products run, cached by what it depends on; MFU <= 100 %."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.core.totals import compute_totals
from dtpo.session.loop import mfu
from dtpo.session.loop.precision import PRECISIONS, Precision
from dtpo.telemetry.summary import peak_caveat

QUIET_MACHINE = {"load_1min": 0.1, "cpus": 8.0}
BUSY_MACHINE = {"load_1min": 3.5, "cpus": 2.0}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own, on a machine whose load average reads quiet (whatever it really is)."""
    monkeypatch.setenv("DTPO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mfu, "load_average", lambda: QUIET_MACHINE)
    return tmp_path / mfu.CACHE_FILE


def fake_kernel(monkeypatch: pytest.MonkeyPatch, value: float, quiet: bool = True,
                check: float | None = None) -> list[tuple]:
    """Stand in for the timings: the full measurement gives ``value``; the quick check of a cached peak gives
    ``check`` (default: the cached peak itself, so it stands)."""
    calls: list[tuple] = []

    def best(dtype: torch.dtype, autocast: bool) -> tuple[float, str, bool]:
        calls.append((dtype, autocast))
        return value, "float32 mm 256x256", quiet

    def quick(dtype: torch.dtype, autocast: bool, kernel: str) -> float | None:
        cached = json.loads((mfu.cache_dir() / mfu.CACHE_FILE).read_text())[mfu.cpu_peak_key(dtype, autocast)]
        assert kernel == cached["kernel"]  # the check times the cached peak's own kernel
        return cached["value"] if check is None else check

    monkeypatch.setattr(mfu, "_best_kernel", best)
    monkeypatch.setattr(mfu, "quick_check", quick)
    return calls


def test_cpu_peak_is_measured_then_cached_with_how_it_was_obtained(cache: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_kernel(monkeypatch, 5e10)
    first = mfu.peak_flops(torch.device("cpu"), torch.float32)
    assert first.value == 5e10 and first.source == "measured"
    assert first.note.startswith("measured now: best of float32 mm 256x256 on ")
    [(key, entry)] = json.loads(cache.read_text()).items()
    assert key == mfu.cpu_peak_key(torch.float32, autocast=False)
    assert entry["value"] == 5e10 and entry["autocast"] is False and entry["dtype"] == "float32"
    second = mfu.peak_flops(torch.device("cpu"), torch.float32)
    assert second.value == 5e10 and second.note.startswith(f"cached from {entry['measured_at']}: best of float32")
    assert len(calls) == 1


def test_a_peak_measured_on_a_busy_cpu_is_used_but_not_cached(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_kernel(monkeypatch, 1e9, quiet=False)
    assert "measured under load (the timing thread was descheduled), so not cached" in mfu.peak_flops(
        torch.device("cpu"), torch.float32).note
    assert not cache.exists()
    mfu.peak_flops(torch.device("cpu"), torch.float32)
    assert len(calls) == 2  # measured again next time, hoping for a quiet moment


def test_the_cache_is_keyed_by_everything_the_peak_depends_on(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = mfu.cpu_peak_key(torch.bfloat16, autocast=True, threads=4)
    assert len({base, mfu.cpu_peak_key(torch.bfloat16, autocast=False, threads=4),
                mfu.cpu_peak_key(torch.float16, autocast=True, threads=4),
                mfu.cpu_peak_key(torch.bfloat16, autocast=True, threads=2)}) == 4
    monkeypatch.setattr(mfu, "cpu_model", lambda: "Other CPU")
    assert mfu.cpu_peak_key(torch.bfloat16, autocast=True, threads=4) != base
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert "torch=0.0.1" in mfu.cpu_peak_key(torch.bfloat16, autocast=True, threads=4)
    monkeypatch.undo()
    # An entry for another dtype, a v1-style bare number, or garbage is not used.
    monkeypatch.setenv("DTPO_CACHE_DIR", str(cache.parent))
    cache.write_text(json.dumps({
        mfu.cpu_peak_key(torch.float16, autocast=True): {"value": 1.0, "kernel": "x", "measured_at": "then"},
        mfu.cpu_peak_key(torch.bfloat16, autocast=False): 1.0,
        mfu.cpu_peak_key(torch.bfloat16, autocast=True): {"value": float("nan"), "kernel": "x", "measured_at": "t"},
    }))
    calls = fake_kernel(monkeypatch, 7e9)
    assert mfu.peak_flops(torch.device("cpu"), torch.bfloat16).value == 7e9  # autocast by default for bf16
    assert mfu.peak_flops(torch.device("cpu"), torch.bfloat16, autocast=False).value == 7e9
    assert calls == [(torch.bfloat16, True), (torch.bfloat16, False)]
    assert mfu.peak_flops(torch.device("cpu"), torch.float16).value == 1.0  # its own entry


def test_a_cached_peak_a_quick_check_beats_is_measured_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After ``make test`` the cache held a peak measured while the suite kept the CPUs busy."""
    monkeypatch.setattr(mfu, "load_average", lambda: BUSY_MACHINE)
    fake_kernel(monkeypatch, 2e10)
    under_load = mfu.peak_flops(torch.device("cpu"), torch.float32)
    assert under_load.note.endswith("; measured under load (load average 3.5 on 2 CPUs)")
    measured_at = json.loads(cache.read_text())[mfu.cpu_peak_key(torch.float32, autocast=False)]["measured_at"]
    monkeypatch.setattr(mfu, "load_average", lambda: QUIET_MACHINE)
    calls = fake_kernel(monkeypatch, 5e10, check=4e10)  # the quiet machine's quick check: 2x the cached peak
    again = mfu.peak_flops(torch.device("cpu"), torch.float32)
    assert again.value == 5e10 and len(calls) == 1
    assert again.note.endswith(f"; re-measured: the cached peak (20.0 GFLOP/s, measured {measured_at} at load "
                               "average 3.5 on 2 CPUs) was below a quick check (40.0 GFLOP/s)")
    assert again.note.startswith("measured now: best of float32 mm 256x256 on ")
    assert "; measured under load" not in again.note  # the new one was measured on a quiet machine
    run = RunRecord("r", "completed", "t", ranks=[RankRecord(0, 0, "n", "cpu", peak_flops=again)])
    assert peak_caveat(run) == again.note  # what the summary shows under the MFU
    [entry] = json.loads(cache.read_text()).values()
    assert entry["value"] == 5e10 and entry["load"] == QUIET_MACHINE


def test_a_cached_peak_a_quick_check_does_not_beat_by_much_stands(cache: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake_kernel(monkeypatch, 5e10)
    mfu.peak_flops(torch.device("cpu"), torch.float32)
    calls = fake_kernel(monkeypatch, 9e10, check=mfu.IMPLAUSIBLE * 5e10)  # at the limit: within noise
    kept = mfu.peak_flops(torch.device("cpu"), torch.float32)
    assert kept.value == 5e10 and kept.note.startswith("cached from ") and not calls
    assert peak_caveat(RunRecord("r", "completed", "t", ranks=[RankRecord(0, 0, "n", "cpu", peak_flops=kept)])) is None


def test_a_peak_cached_under_load_says_so_each_time_it_is_used(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mfu, "load_average", lambda: BUSY_MACHINE)
    fake_kernel(monkeypatch, 2e10)
    mfu.peak_flops(torch.device("cpu"), torch.float32)
    monkeypatch.setattr(mfu, "load_average", lambda: QUIET_MACHINE)
    cached = mfu.peak_flops(torch.device("cpu"), torch.float32)  # the check agrees: used, and marked
    assert cached.value == 2e10 and cached.note.startswith("cached from ")
    assert cached.note.endswith("; measured under load (load average 3.5 on 2 CPUs)")
    run = RunRecord("r", "completed", "t", ranks=[RankRecord(0, 0, "n", "cpu", peak_flops=cached)])
    assert peak_caveat(run) == cached.note


@pytest.mark.parametrize(("load", "cpus", "threads", "busy"), [
    (0.9, 2, 2, False), (1.0, 2, 2, True),  # one CPU's worth of other work on a machine this process fills
    (4.5, 16, 8, False), (9.0, 16, 8, True),  # other work beyond the 8 CPUs this process leaves free
    (1.5, 2, 4, True),  # more threads than CPUs: any other work competes
])
def test_under_load_means_more_work_than_the_free_cpus(load: float, cpus: int, threads: int, busy: bool) -> None:
    assert mfu.under_load(load, cpus, threads) is busy
    text = mfu.busy_load({"load_1min": load, "cpus": float(cpus)}, threads)
    assert text == (f"load average {load:g} on {cpus} CPUs" if busy else "")
    assert mfu.busy_load(None, threads) == "" and mfu.busy_load({"load_1min": "high"}, threads) == ""


def test_the_quick_check_times_the_cached_kernel_at_a_small_size(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    build = mfu.cpu_kernels(torch.float32, autocast=False)["float32 mm"]
    monkeypatch.setattr(mfu, "cpu_kernels", lambda dtype, autocast: {"float32 mm": lambda n: sizes.append(n) or
                                                                      build(n)})
    monkeypatch.setattr(mfu, "_CHECK_SIZE", 64)
    assert (mfu.quick_check(torch.float32, False, "float32 mm 1024x1024") or 0) > 0 and sizes == [64]
    assert mfu.quick_check(torch.float32, False, "float32 mm 32x32") and sizes[-1] == 32
    assert mfu.quick_check(torch.float32, False, "float16 linear 256x256") is None  # not a kernel of this dtype
    assert mfu.quick_check(torch.float32, False, "garbage") is None


def test_a_cache_another_user_could_write_is_not_used(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    planted = {mfu.cpu_peak_key(torch.float32, autocast=False): {"value": 1.0, "kernel": "float32 mm 256x256",
                                                                 "measured_at": "then"}}
    cache.write_text(json.dumps(planted))
    cache.parent.chmod(0o777)
    calls = fake_kernel(monkeypatch, 3e10)
    with caplog.at_level("WARNING", logger="dtpo"):
        assert mfu.peak_flops(torch.device("cpu"), torch.float32).value == 3e10
    assert len(calls) == 1 and "is not used" in caplog.text and "writable by others" in caplog.text
    assert json.loads(cache.read_text()) == planted  # nor written


def test_corrupt_cache_is_remeasured(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.write_text("{oops")
    fake_kernel(monkeypatch, 3e9)
    assert mfu.peak_flops(torch.device("cpu"), torch.float32).value == 3e9


def test_mixed_precision_peaks_include_the_kernels_autocast_runs() -> None:
    names = list(mfu.cpu_kernels(torch.float16, autocast=True))
    assert names == ["float16 mm", "autocast float16 mm", "autocast float16 linear"]
    assert list(mfu.cpu_kernels(torch.float32, autocast=False)) == ["float32 mm", "float32 linear"]
    run = mfu.cpu_kernels(torch.bfloat16, autocast=True)["autocast bfloat16 linear"](8)
    assert run().dtype == torch.bfloat16  # float32 inputs, multiplied in the autocast dtype as the model's are


@pytest.mark.parametrize("precision", PRECISIONS)
def test_mfu_of_a_tiny_model_stays_within_100_percent(precision: str, cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The real path: the measured peak for the precision, FLOPs counted and steps timed as the Session does.

    With the float16 peak taken from a raw ``torch.mm`` alone, ``16-mixed`` came out at 256 %.
    """
    monkeypatch.setattr(mfu, "_SIZES", (256,))  # the model's products are no larger; keeps the test short
    monkeypatch.setattr(mfu, "_BURSTS", 2)
    torch.manual_seed(0)
    device = torch.device("cpu")
    prec = Precision(precision, device)
    peak = mfu.peak_flops(device, prec.compute_dtype)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def one_step() -> None:
        with prec.forward_context():
            out = prec.to_float32(model(x))
        prec.backward(nn.functional.cross_entropy(out, y))
        prec.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as counter:
        one_step()
    steps = []
    for i in range(3):
        start = time.perf_counter()
        one_step()
        elapsed = time.perf_counter() - start
        steps.append(StepRecord(step=i, warmup=False, samples=32, step_s=elapsed, data_wait_s=0.0,
                                compute_s=elapsed, tail_s=0.0, optimizer_s=0.0))
    rank = RankRecord(0, 0, "n", "cpu", flops_per_step=float(counter.get_total_flops()), peak_flops=peak,
                      steps=steps)
    result = compute_totals([rank])["mfu"]
    assert result.value is not None, result.note  # the peak describes the kernels: no need to give up
    assert 0 < result.value <= 1
