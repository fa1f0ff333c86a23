"""``dtpo launch --framework jax|tensorflow`` across nodes: two launchers (``--nnodes 2``, one worker each, a c10d
rendezvous) form one job, as on two machines; the preparation of each worker (JAX's coordinator on rank 0's node,
TensorFlow's ``TF_CONFIG`` gathered over dtpo's channel) spans the launchers. Run on one machine here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli, free_port

from dtpo.core.record import RunRecord
from frameworks.support import needs

pytestmark = [pytest.mark.slow, pytest.mark.framework]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("framework", "example"), [
    pytest.param("jax", "jax_data_parallel.py", marks=needs("jax")),
    pytest.param("tensorflow", "tensorflow_custom_loop.py", marks=needs("tensorflow")),
])
def test_two_launchers_make_one_job_of_the_frameworks_processes(framework: str, example: str, tmp_path: Path) -> None:
    endpoint = f"localhost:{free_port()}"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    launchers = [subprocess.Popen(dtpo_cli("launch", "--framework", framework, "--nnodes", "2", "--node-rank",
                                           str(node), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                           "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes", "--run-dir",
                                           str(tmp_path / "run"), str(EXAMPLES / example), "--steps", "12"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
                 for node in (0, 1)]
    outputs = [launcher.communicate(timeout=400) for launcher in launchers]
    for launcher, (out, err) in zip(launchers, outputs, strict=True):
        assert launcher.returncode == 0, out[-2000:] + err[-3000:]
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "completed" and [rank.rank for rank in record.ranks] == [0, 1]
    assert record.environment["nnodes"] == 2
    assert [len(rank.steps) for rank in record.ranks] == [12, 12]
