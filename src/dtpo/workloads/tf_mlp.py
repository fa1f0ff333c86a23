"""The built-in TensorFlow workload: an MLP learning a random teacher's labels, by a custom training loop.

Run by ``dtpo train --framework tensorflow`` (through ``dtpo launch --framework tensorflow -m
dtpo.workloads.tf_mlp``), or alone::

    python -m dtpo.workloads.tf_mlp --steps 200 --batch-size 128 [--lr 0.05] [--seed 0]

One ``tf.function`` step runs ``strategy.run`` over the replicas: ``MultiWorkerMirroredStrategy`` where
``TF_CONFIG`` names several workers (``dtpo launch`` writes it), else TensorFlow's default strategy. Each worker
generates its own batches (``--batch-size`` rows per worker, so the global batch is that times the workers), the
loss is averaged over the global batch and the optimizer's update all-reduces the gradients. The task is the
JAX workload's (:mod:`dtpo.workloads.jax_mlp`: the same teacher, model shape and plain SGD), so the two
frameworks' runs compare. Each step is reported to dtpo through :class:`~dtpo.frameworks.tf_tracker.Tracker`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from dtpo.core.logs import configure_logging
from dtpo.workloads.framework_args import parse_workload_args

log = logging.getLogger("dtpo.workloads.tf_mlp")  # also when run as __main__

TEACHER_SEED = 20_240_601  # fixed so every worker and every run learns the same task (jax_mlp's)
IN_FEATURES, HIDDEN, DEPTH, CLASSES = 64, 256, 2, 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The workload's flags (:func:`~dtpo.workloads.framework_args.parse_workload_args`)."""
    return parse_workload_args("dtpo.workloads.tf_mlp", __doc__.splitlines()[0], argv)


def cluster() -> tuple[int, int]:
    """This worker's index and the number of workers, from ``TF_CONFIG`` (one worker, index 0, without it).

    Raises:
        SystemExit: A ``TF_CONFIG`` that is not the JSON ``MultiWorkerMirroredStrategy`` reads (one line, 2).
    """
    text = os.environ.get("TF_CONFIG", "").strip()
    if not text:
        return 0, 1
    try:
        config = json.loads(text)
        workers = len(config["cluster"]["worker"])
        index = int(config.get("task", {}).get("index", 0))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.error("dtpo.workloads.tf_mlp: TF_CONFIG is not a cluster of workers (%s: %s)", type(exc).__name__, exc)
        sys.exit(2)
    return index, max(workers, 1)


def local_batches(batch_size: int, seed: int, index: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """This worker's endless batches: Gaussian inputs labelled by a fixed random tanh teacher."""
    teacher = np.random.default_rng(TEACHER_SEED)
    w1 = teacher.standard_normal((IN_FEATURES, 64)) / IN_FEATURES**0.5
    w2 = teacher.standard_normal((64, CLASSES)) / 8.0
    rng = np.random.default_rng([seed, index])
    while True:
        x = rng.standard_normal((batch_size, IN_FEATURES)).astype(np.float32)
        yield x, (np.tanh(x @ w1) @ w2).argmax(axis=1).astype(np.int32)


def step_flops(batch_size: int) -> float:
    """FLOPs of one training step on ``batch_size`` samples: each weight's multiply-add forward, twice backward."""
    sizes = [IN_FEATURES] + [HIDDEN] * DEPTH + [CLASSES]
    return 6.0 * batch_size * sum(n_in * n_out for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True))


def build(tf: Any, strategy: Any, lr: float, global_batch: int) -> tuple[Any, Any]:
    """The model (``DEPTH`` hidden ReLU layers of ``HIDDEN`` units, then the class logits) and one step:
    ``(x, y) -> loss`` over the global batch, a ``tf.function`` running ``strategy.run``."""
    with strategy.scope():
        layers = [tf.keras.Input((IN_FEATURES,))]
        layers += [tf.keras.layers.Dense(HIDDEN, activation="relu") for _ in range(DEPTH)]
        model = tf.keras.Sequential([*layers, tf.keras.layers.Dense(CLASSES)])
        optimizer = tf.keras.optimizers.SGD(lr)

    def replica_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_sample, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    return model, train_step


def train(steps: int, batch_size: int, lr: float, seed: int) -> float:
    """Train for ``steps`` steps, reporting each to dtpo. Returns the last step's loss (over the global batch)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines (gRPC, coordination)
    os.environ["KERAS_BACKEND"] = "tensorflow"  # tf.keras is Keras 3 on KERAS_BACKEND: this model is TensorFlow's
    import tensorflow as tf

    from dtpo.frameworks.tf_tracker import Tracker

    threads = int(os.environ.get("OMP_NUM_THREADS", 0) or 0)  # dtpo train's threads per worker
    if threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    index, workers = cluster()
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if workers > 1 else tf.distribute.get_strategy()
    local_replicas = max(1, strategy.num_replicas_in_sync // workers)
    if batch_size % local_replicas:
        log.error("dtpo.workloads.tf_mlp: --batch-size %d does not split over this worker's %d replicas",
                  batch_size, local_replicas)
        sys.exit(2)
    tf.keras.utils.set_random_seed(seed)  # the same initial weights on every worker
    model, train_step = build(tf, strategy, lr, batch_size * workers)
    batches = local_batches(batch_size, seed, index)

    def next_batch() -> tuple[Any, Any]:
        x, y = next(batches)
        if local_replicas == 1:
            return tf.constant(x), tf.constant(y)
        share = batch_size // local_replicas  # each local replica's rows of this worker's batch

        def part(array: np.ndarray) -> Any:
            return strategy.experimental_distribute_values_from_function(
                lambda ctx: array[(ctx.replica_id_in_sync_group % local_replicas) * share:][:share])

        return part(x), part(y)

    first = loss = None
    config = {"workload": "tf_mlp", "batch_size": batch_size, "lr": lr, "seed": seed, "workers": workers}
    with Tracker(total_steps=steps, samples_per_step=batch_size, flops_per_step=step_flops(batch_size),
                 config=config) as tracker:
        for step in range(steps):
            loss = train_step(*next_batch())
            tracker.step(loss)
            if step == 0:
                first = loss
    assert first is not None and loss is not None
    if index == 0:
        log.info("tf_mlp: loss %.4f after the first step, %.4f after step %d (%d worker%s, %d parameters)",
                 float(first), float(loss), steps, workers, "" if workers == 1 else "s", model.count_params())
    return float(loss)


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, train."""
    args = parse_args(argv)
    configure_logging()
    train(args.steps, args.batch_size, args.lr, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
