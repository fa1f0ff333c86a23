"""A Keras 3 MLP trained with ``Model.fit`` on synthetic data, on whichever backend ``KERAS_BACKEND`` names::

    python -m dtpo.workloads.keras_mlp --steps 50 --batch-size 64
    dtpo launch --framework keras --nproc-per-node 2 -m dtpo.workloads.keras_mlp --steps 50 --batch-size 64

Gaussian vectors labelled by a fixed random teacher network (the ``mlp`` workload's task, in NumPy), so the loss
falls. ``--steps`` training batches of ``--batch-size`` samples on each process, in one epoch. With several
processes (``WORLD_SIZE`` > 1) it trains as each backend allows:

* **TensorFlow**: ``tf.distribute.MultiWorkerMirroredStrategy`` over the ``TF_CONFIG`` the launch wrote; every
  process holds the same data and fits global batches of ``batch_size * WORLD_SIZE``, which TensorFlow splits
  so that each process trains on ``batch_size``.
* **JAX**: ``jax.distributed.initialize()`` (the launch fills in the coordinator), then
  ``keras.distribution.DataParallel`` over every process's devices; each process feeds its own shard
  (``auto_shard_dataset=False``), batches of ``batch_size``.
* **PyTorch**: Keras's torch backend has no multi-process data parallelism in ``fit``; each process fits its own
  shard on its own copy of the model (the steps and energy are measured all the same; the models do not agree).

It does not add dtpo's callback itself: under ``dtpo launch`` the agent adds one to ``Model.fit``, as it does
for any script, and run plainly it trains unmeasured.

Two workarounds for Keras 3 under ``MultiWorkerMirroredStrategy`` (TensorFlow 2.16 and later,
tensorflow/tensorflow#72388), harmless elsewhere: the features and the label travel in one array (Keras's
first-batch build reduces the batch with ``strategy.reduce``, which fails on an ``(x, y)`` tuple), and the
logs of each step have shape ``(1,)`` (Keras reduces them with ``axis=0``, which fails on a scalar).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dtpo.workloads.framework_args import parse_workload_args

log = logging.getLogger("dtpo.workloads.keras_mlp")

TEACHER_SEED = 20_240_601
IN_FEATURES, HIDDEN, CLASSES = 32, 128, 10


def synthetic(samples: int, seed: int) -> np.ndarray:
    """``samples`` rows of Gaussian features with the teacher's label in the last column (float32)."""
    teacher = np.random.default_rng(TEACHER_SEED)
    w1 = teacher.normal(size=(IN_FEATURES, 64)) / IN_FEATURES**0.5
    w2 = teacher.normal(size=(64, CLASSES)) / 8.0
    x = np.random.default_rng(seed).normal(size=(samples, IN_FEATURES))
    labels = (np.tanh(x @ w1) @ w2).argmax(axis=1)
    return np.concatenate([x, labels[:, None]], axis=1).astype("float32")


def build_model(keras: Any) -> Any:
    """The MLP, reading its features and label from one packed array."""
    ops = keras.ops

    class PackedMLP(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.body = [keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(HIDDEN, activation="relu")]
            self.head = keras.layers.Dense(CLASSES)

        def call(self, packed: Any) -> Any:
            h = packed[:, :IN_FEATURES]
            for layer in self.body:
                h = layer(h)
            return self.head(h)

        def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                         training: bool = True) -> Any:
            labels = ops.cast(x[:, IN_FEATURES], "int32")
            return super().compute_loss(x, labels, y_pred, sample_weight, training)

    if keras.backend.backend() == "tensorflow":
        def one_dimensional(logs: dict[str, Any]) -> dict[str, Any]:
            return {name: ops.reshape(value, (1,)) for name, value in logs.items()}

        class TFPackedMLP(PackedMLP):
            def train_step(self, data: Any) -> Any:
                return one_dimensional(super().train_step(data))

            def test_step(self, data: Any) -> Any:
                return one_dimensional(super().test_step(data))

        return TFPackedMLP()
    return PackedMLP()


def train(steps: int, batch_size: int, lr: float, seed: int) -> float:
    """Fit the MLP for ``steps`` batches of ``batch_size`` on this process; returns the last training loss."""
    import keras

    backend = keras.backend.backend()
    rank, world = int(os.environ.get("RANK", 0) or 0), int(os.environ.get("WORLD_SIZE", 1) or 1)
    keras.utils.set_random_seed(seed)  # the same initial weights on every process
    data, batch, scope = synthetic(steps * batch_size, seed + rank), batch_size, None
    if world > 1 and backend == "tensorflow":
        import tensorflow as tf

        scope = tf.distribute.MultiWorkerMirroredStrategy().scope()
        data = synthetic(steps * batch_size * world, seed)  # the same on every process: TensorFlow shards it
        batch = batch_size * world
    elif world > 1 and backend == "jax":
        import jax

        jax.distributed.initialize()
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices(),
                                                                            auto_shard_dataset=False))
    elif world > 1:
        log.info("keras/torch: Keras's torch backend has no multi-process data parallelism in fit; each of the %d "
                 "processes fits its own shard", world)
    with scope or contextlib.nullcontext():
        model = build_model(keras)
        model.compile(optimizer=keras.optimizers.Adam(lr),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(data, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    losses = np.ravel(history.history.get("loss", [math.nan]))
    loss = float(losses[-1])
    if rank == 0:
        log.info("keras/%s: %d steps of %d samples per process on %d process(es); final loss %.4f", backend, steps,
                 batch_size, world, loss)
    return loss


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the flags and train."""
    args = parse_workload_args("dtpo.workloads.keras_mlp", __doc__.split("\n")[0], argv, steps=100, batch_size=64,
                               lr=1e-3, optimizer="Adam")
    from dtpo.core.logs import configure_logging

    configure_logging()
    train(args.steps, args.batch_size, args.lr, args.seed)


if __name__ == "__main__":
    main()
