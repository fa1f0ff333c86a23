"""``dtpo launch --framework tensorflow`` on 2 local workers: each gets the ``TF_CONFIG`` of a 2-worker cluster
(its own index, every worker's address) and ``MultiWorkerMirroredStrategy`` all-reduces across them; the example,
the built-in workload and a custom loop counting its own steps get a complete record that agrees with them; a
loop that reports no step gets one line instead of an empty record; a ``TF_CONFIG`` already set and a
``--coordinator-port`` in use are refused in one line, exit 2, before any worker starts and with no run left."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import dtpo_cli

from dtpo.core.record import RunRecord
from dtpo.distributed.launch_args import port_free
from frameworks.support import needs

pytestmark = [needs("tensorflow"), pytest.mark.framework, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tensorflow_custom_loop.py"
SCRIPT = Path(__file__).resolve().parent / "scripts" / "tf_custom_loop.py"
STEPS, BATCH = 6, 8  # the custom loop's defaults


def launch(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
           run_dir: bool = True) -> subprocess.CompletedProcess[str]:
    """``dtpo launch --framework tensorflow --standalone --nproc-per-node 2 ARGS``, its run in ``tmp_path/run``."""
    where = ["--run-dir", str(tmp_path / "run")] if run_dir else []
    environ = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"} | (env or {})
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return subprocess.run(dtpo_cli("launch", "--framework", "tensorflow", "--standalone", "--nproc-per-node", "2",
                                   *where, *args),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environ)


def completed(result: subprocess.CompletedProcess[str], tmp_path: Path, steps: int, samples: int) -> RunRecord:
    """The launch succeeded; its record is complete, with both ranks' steps and samples as given."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "completed"
    assert [rank.rank for rank in record.ranks] == [0, 1]
    for rank in record.ranks:
        assert len(rank.steps) == steps, f"rank {rank.rank}"
        assert sum(step.samples for step in rank.steps) == samples, f"rank {rank.rank}"
        assert rank.device == "cpu (tensorflow)"
    assert record.config["user"]["framework"] == "tensorflow"
    return record


def own_counts(tmp_path: Path) -> list[dict[str, Any]]:
    """What each worker of the custom loop wrote about itself, by its ``TF_CONFIG`` task index."""
    return [json.loads((tmp_path / f"counts.{index}").read_text()) for index in range(2)]


def free_pair() -> int:
    """A port ``P`` with ``P`` and ``P + 1`` both free here now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        if port < 65535:
            with socket.socket() as first, socket.socket() as second:
                try:
                    first.bind(("", port))
                    second.bind(("", port + 1))
                except OSError:
                    continue
            return port
    pytest.skip("no two consecutive free ports found")


def expected_weights(steps: int, batch: int) -> np.ndarray:
    """The custom loop's weights after SGD on the gradient summed over both workers' own data (each worker's
    loss averaged over the global batch): what an all-reduce of the two gives, and neither worker alone."""
    import tensorflow as tf

    weights = np.zeros((8, 1))
    for step in range(steps):
        grad = np.zeros_like(weights)
        for index in range(2):
            x = tf.random.stateless_normal((batch, 8), seed=(index, step)).numpy().astype(np.float64)
            y = x.sum(axis=1, keepdims=True) * (1.0 + index)
            grad += 2.0 * x.T @ (x @ weights - y) / (2 * batch)
        weights -= 0.1 * grad
    return weights.ravel()


def test_a_custom_loop_gets_a_two_worker_cluster_its_all_reduce_and_an_agreeing_record(tmp_path: Path) -> None:
    port = free_pair()
    result = launch(tmp_path, "--coordinator-port", str(port), str(SCRIPT), "--counts", str(tmp_path / "counts"),
                    "--tracker")
    completed(result, tmp_path, STEPS, STEPS * BATCH)
    own = own_counts(tmp_path)
    workers = [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]  # --coordinator-port: PORT + local rank
    for index, worker in enumerate(own):
        assert worker["tf_config"] == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        assert worker["replicas"] == 2 and (worker["steps"], worker["samples"]) == (STEPS, STEPS * BATCH)
    assert own[0]["first_batch"] != own[1]["first_batch"]  # each worker trained on data of its own ...
    assert own[0]["weights"] == own[1]["weights"]  # ... and ends with the same weights: the gradients were summed
    np.testing.assert_allclose(own[0]["weights"], expected_weights(STEPS, BATCH), rtol=1e-4, atol=1e-5)


def test_the_example_is_measured_per_step_with_each_workers_share_of_the_batch(tmp_path: Path) -> None:
    result = launch(tmp_path, str(EXAMPLE), "--steps", "5", "--batch-size", "16")
    completed(result, tmp_path, 5, 5 * 16)  # a global batch of 32 per step, 16 on each worker


def test_the_built_in_workload_trains_on_both_workers(tmp_path: Path) -> None:
    result = launch(tmp_path, "-m", "dtpo.workloads.tf_mlp", "--steps", "4", "--batch-size", "16")
    record = completed(result, tmp_path, 4, 4 * 16)
    assert record.config["user"]["workload"] == "tf_mlp" and record.config["user"]["workers"] == 2
    from dtpo.workloads.tf_mlp import step_flops

    assert all(rank.flops_per_step == step_flops(16) for rank in record.ranks)  # each worker's share, for MFU
    assert "tf_mlp: loss" in result.stderr + result.stdout


def test_a_loop_that_reports_no_step_gets_one_line_and_no_empty_record(tmp_path: Path) -> None:
    result = launch(tmp_path, str(SCRIPT), "--counts", str(tmp_path / "counts"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [worker["steps"] for worker in own_counts(tmp_path)] == [STEPS, STEPS]  # it trained, over 2 workers
    assert own_counts(tmp_path)[0]["replicas"] == 2
    output = result.stdout + result.stderr
    assert "reported no training step" in output and "dtpo.tensorflow.Tracker" in output
    assert not (tmp_path / "run" / "record.json").exists()


def test_a_tf_config_already_set_is_refused_in_one_line_with_no_run_left(tmp_path: Path) -> None:
    config = json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}})
    for run_dir in (True, False):
        result = launch(tmp_path, str(SCRIPT), "--counts", str(tmp_path / "counts"), env={"TF_CONFIG": config},
                        run_dir=run_dir)
        assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "TF_CONFIG is already set" in lines[0], result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()
    assert not list(tmp_path.glob("counts.*"))  # no worker started


def test_a_coordinator_port_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        for first in (port, port - 1):  # the first worker's port, or the second's (PORT + 1)
            if first != port and not port_free(first):
                continue
            result = launch(tmp_path, "--coordinator-port", str(first), str(SCRIPT), "--counts",
                            str(tmp_path / "counts"))
            assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and f"port {port} is in use" in lines[0], result.stderr
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob("counts.*"))
