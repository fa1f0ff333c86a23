"""``dtpo.tensorflow.Tracker`` in one process: a real ``tf.function`` loop's exact steps and samples, the result
read back only where a window of steps closes, distributed values and batches, and a run with no step."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dtpo.core.config import RunConfig
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord
from frameworks.support import needs

pytestmark = [needs("tensorflow"), pytest.mark.framework]

QUIET = {"progress": False, "summary": False, "energy": False}


@pytest.fixture(autouse=True)
def _alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "DTPO_CONFIG", "DTPO_LAUNCHED", "DTPO_RUN_DIR",
                 "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def tf() -> Any:
    import tensorflow

    return tensorflow


class Pending:
    """A step's result that notes when it is read back (as ``read_back`` reads a tensor: ``.numpy()``)."""

    def __init__(self, step: int, read: list[int]) -> None:
        self.step, self.read = step, read

    def numpy(self) -> int:
        self.read.append(self.step)
        return self.step


def test_a_tf_function_loop_records_its_exact_steps_and_samples(tf: Any, tmp_path: Path) -> None:
    from dtpo.tensorflow import Tracker

    tf.random.set_seed(0)
    weights = tf.Variable(tf.zeros((4, 1)))

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ weights - y) ** 2)
        weights.assign_sub(0.1 * tape.gradient(loss, weights))
        return loss

    sizes = [8, 8, 5, 8, 3, 8, 8]
    with Tracker(total_steps=len(sizes), run_dir=tmp_path / "run", warmup_steps=1, window_steps=3, **QUIET) as t:
        for size in sizes:
            x = tf.random.normal((size, 4))
            t.step(train_step(x, tf.reduce_sum(x, axis=1, keepdims=True)), batch=x)
    record = RunRecord.load(tmp_path / "run")
    (rank,) = record.ranks
    assert record.status == "completed" and t.step_count == len(sizes)
    assert [step.samples for step in rank.steps] == sizes
    assert [step.warmup for step in rank.steps] == [True] + [False] * 6
    assert record.config["user"] == {"framework": "tensorflow"}
    gpu = bool(tf.config.list_physical_devices("GPU"))
    assert rank.device.startswith("cuda:0 (") if gpu else rank.device == "cpu (tensorflow)"
    assert rank.device.endswith("tensorflow)")


def test_the_result_is_read_back_only_where_a_window_closes(tf: Any, tmp_path: Path) -> None:
    from dtpo.tensorflow import Tracker

    read: list[int] = []
    tracker = Tracker(samples_per_step=16, run_dir=tmp_path / "run", warmup_steps=2, window_steps=5, **QUIET)
    for step in range(17):
        tracker.step(Pending(step, read))
    assert read == [0, 5, 10, 15]  # at the warm-up's end and each window's, the step before; never in between
    tracker.finish()
    assert read == [0, 5, 10, 15, 16]  # finish waits for the last step's work
    (rank,) = RunRecord.load(tmp_path / "run").ranks
    assert len(rank.steps) == 17 and sum(step.samples for step in rank.steps) == 17 * 16


def test_a_known_total_reads_back_its_last_step_and_a_nest_is_read_whole(tf: Any, tmp_path: Path) -> None:
    from dtpo.tensorflow import Tracker

    read: list[int] = []
    with Tracker(total_steps=9, samples_per_step=2, run_dir=tmp_path / "run", warmup_steps=2, window_steps=5,
                 **QUIET) as tracker:
        for step in range(9):
            tracker.step({"loss": Pending(step, read), "extra": (Pending(100 + step, read), 3.0)})
    assert read == [100, 0, 105, 5, 108, 8, 108, 8]  # tf.nest: a dict's leaves in key order; the last exact


PER_REPLICA = textwrap.dedent("""
    import tensorflow as tf
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    from dtpo.frameworks.tf_tracker import batch_rows, read_back
    cpus = tf.config.list_logical_devices("CPU")
    strategy = tf.distribute.MirroredStrategy([device.name for device in cpus[:2]])
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(tf.ones((12, 3))).batch(6))
    batch = next(iter(data))
    assert isinstance(batch, tf.distribute.DistributedValues)
    assert batch_rows(batch) == 6, batch_rows(batch)  # both replicas' shares on this worker
    result = strategy.run(lambda x: tf.reduce_sum(x), args=(batch,))
    assert isinstance(result, tf.distribute.DistributedValues)
    read_back({"loss": result, "host": 1.0})  # every replica's tensor copied back; no error on plain values
    print("per-replica ok")
""")


@pytest.mark.slow
def test_distributed_results_and_batches_are_read_and_counted_per_replica() -> None:
    """In a process of its own: TensorFlow shows two CPU devices only if told before it starts."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", PER_REPLICA], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and "per-replica ok" in result.stdout, result.stderr[-3000:]


def test_a_run_with_no_step_finishes_cleanly(tf: Any, tmp_path: Path) -> None:
    from dtpo.tensorflow import Tracker

    tracker = Tracker(total_steps=10, samples_per_step=4, run_dir=tmp_path / "run", **QUIET)
    record = tracker.finish()
    assert record is not None and record.status == "completed" and record.ranks[0].steps == []
    assert tracker.step_count == 0
    assert tracker.finish() is None  # a second finish does nothing
    with pytest.raises(RuntimeError):
        tracker.step(1.0)


def test_steps_without_a_sample_count_or_with_a_tensor_count_are_refused(tf: Any, tmp_path: Path) -> None:
    from dtpo.tensorflow import Tracker

    with Tracker(run_dir=tmp_path / "run", **QUIET) as tracker:
        with pytest.raises(ConfigError, match="samples=N"):
            tracker.step(tf.constant(1.0))
        with pytest.raises(ConfigError, match="whole numbers"):
            tracker.step(tf.constant(1.0), samples=tf.constant(4))  # would wait for the device at every step
        tracker.step(tf.constant(1.0), samples=4)
    with pytest.raises(ConfigError, match="samples_per_step"):
        Tracker(samples_per_step=-1, run_dir=tmp_path / "other", **QUIET)
    with pytest.raises(ConfigError, match="flops_per_step"):
        Tracker(flops_per_step=float("nan"), run_dir=tmp_path / "other", **QUIET)
    with pytest.raises(ConfigError, match="precision"):
        Tracker(precision="int8", run_dir=tmp_path / "other", **QUIET)


def test_flops_per_step_give_the_record_its_mfu_inputs(tf: Any, tmp_path: Path) -> None:
    from dtpo.tensorflow import Tracker

    with Tracker(samples_per_step=4, flops_per_step=2e6, run_dir=tmp_path / "run", **QUIET) as tracker:
        for _ in range(3):
            tracker.step(tf.constant(1.0))
    (rank,) = RunRecord.load(tmp_path / "run").ranks
    assert rank.flops_per_step == 2e6
    gpu = bool(tf.config.list_physical_devices("GPU"))
    assert rank.peak_flops is not None and rank.peak_flops.source == ("datasheet" if gpu else "measured")


def test_the_launch_configuration_is_the_default_and_arguments_win(tf: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from dtpo.tensorflow import Tracker

    config = RunConfig().replace(session={"window_steps": 3, "warmup_steps": 1}, energy={"enabled": False})
    monkeypatch.setenv("DTPO_CONFIG", str(config.save(tmp_path / "config.json")))
    read: list[int] = []
    tracker = Tracker(samples_per_step=1, run_dir=tmp_path / "run", progress=False, summary=False)
    for step in range(7):
        tracker.step(Pending(step, read))
    tracker.finish()
    assert read == [0, 2, 5, 6]  # the launch's window of 3 after 1 warm-up step
    read.clear()
    tracker = Tracker(samples_per_step=1, run_dir=tmp_path / "run2", window_steps=2, progress=False, summary=False)
    for step in range(5):
        tracker.step(Pending(step, read))
    tracker.finish()
    assert read == [0, 1, 3, 4]  # window_steps=2 given here wins over the launch's 3


def test_a_loop_that_fails_leaves_its_partial_record_without_waiting_for_the_device(tf: Any, tmp_path: Path) -> None:
    import json

    from dtpo.tensorflow import Tracker

    read: list[int] = []
    with pytest.raises(ValueError, match="boom"):
        with Tracker(samples_per_step=2, run_dir=tmp_path / "run", warmup_steps=2, **QUIET) as tracker:
            for step in range(3):
                tracker.step(Pending(step, read))
            raise ValueError("boom")
    assert read == [0]  # the warm-up's end only: a failed run does not wait for its last result
    partial = json.loads((tmp_path / "run" / "ranks" / "rank00000.json").read_text())
    assert partial["status"] == "failed" and partial["error"] == "ValueError: boom"
    assert len(partial["ranks"][0]["steps"]) == 3


def test_a_gpu_is_named_at_the_local_rank_with_its_datasheet_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from dtpo.frameworks.tf_tracker import describe_device, peak_flops

    gpus = [SimpleNamespace(name=f"/physical_device:GPU:{index}") for index in range(2)]
    names = {"/physical_device:GPU:0": "NVIDIA A100-SXM4-40GB", "/physical_device:GPU:1": "NVIDIA H100 80GB HBM3"}
    fake = SimpleNamespace(config=SimpleNamespace(
        list_physical_devices=lambda kind: gpus if kind == "GPU" else [],
        experimental=SimpleNamespace(get_device_details=lambda gpu: {"device_name": names[gpu.name]},
                                     tensor_float_32_execution_enabled=lambda: True)))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert describe_device(fake) == (True, "cuda:1 (NVIDIA H100 80GB HBM3, tensorflow)")
    peak = peak_flops(fake, "bfloat16")
    assert peak.source == "datasheet" and peak.value is not None and peak.value > 1e15  # 2 x H100's bf16 peak
    names["/physical_device:GPU:1"] = "Some Future GPU"
    assert peak_flops(fake, "float32").value is None
