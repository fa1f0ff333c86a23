"""The CPU peak is measured once, then read from the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dtpo.session import mfu


def test_cpu_peak_is_measured_then_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_CACHE_DIR", str(tmp_path))
    first = mfu.peak_flops(torch.device("cpu"), torch.float32)
    assert first.source == "measured" and first.value > 1e8 and "cached" not in first.note
    cache = json.loads((tmp_path / "cpu_peak_flops.json").read_text())
    assert list(cache.values()) == [first.value]

    def must_not_run(dtype: torch.dtype) -> float:
        raise AssertionError("a cached peak was measured again")

    monkeypatch.setattr(mfu, "_time_gemm", must_not_run)
    second = mfu.peak_flops(torch.device("cpu"), torch.float32)
    assert second.value == first.value and "cached" in second.note


def test_corrupt_cache_is_remeasured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_CACHE_DIR", str(tmp_path))
    (tmp_path / "cpu_peak_flops.json").write_text("{oops")
    assert mfu.peak_flops(torch.device("cpu"), torch.float32).value > 0
