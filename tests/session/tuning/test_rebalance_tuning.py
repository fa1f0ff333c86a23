"""--tune rebalance on real gloo ranks: a rank whose virtual GPU is slowed for good gets fewer samples."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.devices.virtual_nvml import ENV
from dtpo.devices.virtual_nvml.make import create, inject

pytest.importorskip("pynvml", reason="nvidia-ml-py (the dev extra) is not installed")
pytestmark = pytest.mark.slow
if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
    pytest.skip("no C compiler to build the NVML stand-in (install gcc)", allow_module_level=True)


def test_a_persistently_slow_rank_gets_fewer_samples_and_the_clocks_take_the_rest(tmp_path: Path) -> None:
    """Two CPU ranks on two virtual A40s, rank 1's slowed 4x (a throttled GPU): --tune rebalance,stragglers moves
    samples to rank 0 (as far as its headroom allows) once the slowness has persisted, and the record says so."""
    gpus = create(tmp_path / "gpus", "A40", 2, "resnet50", root=True, slow_steps=True)
    inject(gpus.directory, 1, slow_factor=4.0)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env |= {ENV: str(gpus.directory), "DTPO_STATE_DIR": str(tmp_path / "state")}
    run_dir = tmp_path / "run"
    done = subprocess.run(dtpo_cli("train", "--workers", "2", "--workload", "mlp", "--steps", "70",
                                   "--tune", "rebalance,stragglers", "--run-dir", str(run_dir)),
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((run_dir / "record.json").read_text())
    slack = record["ranks"][0]["slack"]
    assert slack["initial_shares"] == [128, 128]
    assert slack["share_changes"], slack
    first = slack["share_changes"][0]
    assert first["slow_ranks"] == [1] and first["step"] >= 30  # after three windows of ten steps agreed
    assert sum(slack["shares"]) == 256 and slack["shares"][1] < slack["shares"][0]
    assert "clock_changes" in slack  # the clocks were tuned too
    assert record["ranks"][1]["slack"]["shares"] == slack["shares"]  # every rank decided the same
    samples = [sum(s["samples"] for s in rank["steps"] if s["step"] >= first["step"]) for rank in record["ranks"]]
    assert samples[1] < samples[0]  # the shares were trained on
    assert "rebalance" in done.stdout
