"""``dtpo launch --framework keras`` on an unmodified Keras 3 script (no dtpo import), 2 CPU ranks, per backend:
TensorFlow (``MultiWorkerMirroredStrategy`` over the ``TF_CONFIG`` the launch writes), JAX
(``keras.distribution.DataParallel`` after ``jax.distributed.initialize()``) and PyTorch (each rank fitting its
own shard beside a gloo group of the script's own). The agent adds its callback to ``Model.fit``; the record
must hold both ranks, ``completed``, with the steps and samples the script counted itself.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.core.record import RunRecord
from frameworks.support import needs

pytestmark = [needs("keras"), pytest.mark.slow, pytest.mark.framework]

SCRIPT = Path(__file__).resolve().parent / "scripts" / "keras_fit_script.py"


@pytest.mark.parametrize("backend", [
    pytest.param("tensorflow", marks=needs("tensorflow")),
    pytest.param("jax", marks=needs("jax")),
    pytest.param("torch"),
])
def test_an_unmodified_keras_fit_is_measured_per_batch_on_every_backend(backend: str, tmp_path: Path) -> None:
    counts = tmp_path / "counts"
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(dtpo_cli("launch", "--framework", "keras", "--standalone", "--nproc-per-node", "2",
                                     "--run-dir", str(tmp_path / "run"), str(SCRIPT), "--counts", str(counts)),
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = RunRecord.load(tmp_path / "run")
    own = [json.loads(Path(f"{counts}.{rank}").read_text()) for rank in range(2)]
    # 43 samples per rank in batches of 8 (TensorFlow: global batches of 16 split between the ranks), 2 epochs
    assert own == [{"steps": 12, "samples": 86}] * 2  # the script did what the test meant
    assert record.status == "completed"
    assert [rank.rank for rank in record.ranks] == [0, 1]
    assert record.config["user"]["framework"] == f"keras/{backend}"
    for rank in record.ranks:
        assert len(rank.steps) == 12, f"rank {rank.rank}"
        assert [step.samples for step in rank.steps] == [8, 8, 8, 8, 8, 3] * 2, f"rank {rank.rank}"


def test_a_keras_model_on_torch_under_ddp_is_measured_as_a_torch_loop(tmp_path: Path) -> None:
    """Keras's guide to multi-GPU training on PyTorch: the Keras model in DistributedDataParallel, a torch
    optimizer and loop. The agent measures it as any DDP script (optimizer hooks, DDP's gradient stamps)."""
    counts = tmp_path / "counts"
    env = {**os.environ, "KERAS_BACKEND": "torch", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(dtpo_cli("launch", "--framework", "keras", "--standalone", "--nproc-per-node", "2",
                                     "--run-dir", str(tmp_path / "run"), str(SCRIPT.parent / "keras_torch_ddp.py"),
                                     "--counts", str(counts)),
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = RunRecord.load(tmp_path / "run")
    own = [json.loads(Path(f"{counts}.{rank}").read_text()) for rank in range(2)]
    assert own == [{"steps": 12, "samples": 86}] * 2
    assert record.status == "completed" and [rank.rank for rank in record.ranks] == [0, 1]
    assert record.config["session"]["strategy"] == "ddp"  # measured by the agent, with DDP's marks
    for rank in record.ranks:
        assert [step.samples for step in rank.steps] == [8, 8, 8, 8, 8, 3] * 2, f"rank {rank.rank}"
        assert all(step.comm_exposed_s is not None for step in rank.steps)  # DDP's gradient-ready stamps
