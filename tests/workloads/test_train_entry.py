"""``python -m dtpo.workloads.train``, the worker of ``dtpo train``: its exit codes through run_then_exit."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtpo.workloads.base import EVALUATION_SAMPLES


def run_entry(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "DTPO_CONFIG")}
    return subprocess.run([sys.executable, "-m", "dtpo.workloads.train", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


@pytest.mark.slow
def test_a_bad_configuration_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_entry(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert done.returncode == 2
    assert "takes one configuration file, got 2 arguments" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_run_alone_ends_with_0_and_its_record_written(tmp_path: Path) -> None:
    from dtpo.core.config import EnergyConfig, LaunchConfig, RunConfig, WorkloadConfig

    config = RunConfig(workload=WorkloadConfig(name="mlp", steps=3),
                       launch=LaunchConfig(run_dir=str(tmp_path / "run")), energy=EnergyConfig(enabled=False))
    path = config.save(tmp_path / "config.json")
    done = run_entry(str(path))
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    evaluation = record["ranks"][0]["evaluation"]  # the trained model on the fixed evaluation set
    assert evaluation["samples"] == EVALUATION_SAMPLES and math.isfinite(evaluation["loss"])
    assert "dtpo run" in done.stdout  # the summary was flushed before the process ended
    assert "evaluation loss" in done.stdout
