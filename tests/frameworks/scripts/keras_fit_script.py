"""A plain Keras 3 script trained with ``Model.fit`` on any backend: no dtpo anywhere.

    KERAS_BACKEND=jax torchrun --nproc-per-node 2 keras_fit_script.py            # trains, unmeasured
    KERAS_BACKEND=jax dtpo launch --framework keras --nproc-per-node 2 keras_fit_script.py  # measured per step

With several processes it trains as each backend allows: TensorFlow with ``MultiWorkerMirroredStrategy`` (one
global batch of ``--batch-size`` per process, split by TensorFlow), JAX with ``keras.distribution.DataParallel``
over every process's devices (each process feeds its own shard), PyTorch with each process fitting its own shard
(Keras's torch backend has no multi-process data parallelism in ``fit``; the script still makes a gloo process
group of its own, as a DDP script would, to sum its counts).

It counts its own training steps (a callback of its own, run on Keras's callback thread) and the samples its training
steps saw on this process (``train_step`` itself; on JAX, whose ``train_step`` is traced once, the rows of its
shard times the epochs); ``--counts FILE`` writes them to ``FILE.<rank>`` as JSON. Validation runs
after each epoch and is not training.
"""

import argparse
import contextlib
import json
import os

import keras
import numpy as np
from keras import ops

BACKEND = keras.backend.backend()
FEATURES = 16
SEEN: list = []  # this process's samples, as train_step saw them (not on the model: Keras tracks its lists)
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class StepCount(keras.callbacks.Callback):
    """Counts training batches; safe to run on Keras's callback thread (keeps its asynchronous dispatch)."""

    async_safe = True

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001 - Keras's signature
        self.steps += 1


def one_dimensional(logs: dict) -> dict:
    """Logs of shape ``(1,)``: under ``MultiWorkerMirroredStrategy`` Keras 3 reduces each log with
    ``strategy.reduce("MEAN", v, axis=0)``, which a scalar fails (tensorflow/tensorflow#72388)."""
    return {name: ops.reshape(value, (1,)) for name, value in logs.items()}


class Packed(keras.Model):
    """An MLP on batches that hold the features and the label in one array: Keras 3's first-batch build under
    ``MultiWorkerMirroredStrategy`` reduces the batch with ``strategy.reduce``, which takes one tensor, not an
    ``(x, y)`` tuple. Its ``train_step`` adds the samples of each batch it trains on to ``SEEN``."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.head = keras.layers.Dense(4)

    def call(self, packed):  # noqa: ANN001, ANN201
        return self.head(self.hidden(packed[:, :FEATURES]))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):  # noqa: ANN001, ANN201
        return super().compute_loss(x, ops.cast(x[:, FEATURES], "int32"), y_pred, sample_weight, training)

    if BACKEND == "tensorflow":
        def train_step(self, data):  # noqa: ANN001, ANN201 - counted on the device, this process's replica
            import tensorflow as tf

            SEEN[0].assign_add(tf.cast(tf.shape(data)[0], tf.int64))
            return one_dimensional(super().train_step(data))

        def test_step(self, data):  # noqa: ANN001, ANN201
            return one_dimensional(super().test_step(data))

    elif BACKEND == "torch":
        def train_step(self, data):  # noqa: ANN001, ANN201
            SEEN.append(int(data.shape[0]))
            return super().train_step(data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8, help="per process")
    parser.add_argument("--samples", type=int, default=43, help="per process")
    parser.add_argument("--counts", default=None, help="write the script's own step and sample counts here")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    total = args.samples * WORLD
    data = np.concatenate([rng.normal(size=(total, FEATURES)), rng.integers(0, 4, size=(total, 1))], axis=1)
    data = data.astype("float32")
    val = (data[:24],)
    batch = args.batch_size
    scope = None
    if BACKEND == "tensorflow" and WORLD > 1:
        import tensorflow as tf

        scope = tf.distribute.MultiWorkerMirroredStrategy().scope()
        batch = args.batch_size * WORLD  # global: TensorFlow splits it between the processes
    elif BACKEND == "jax" and WORLD > 1:
        import jax

        jax.distributed.initialize()
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices(),
                                                                            auto_shard_dataset=False))
        data = data[RANK::WORLD]
    elif WORLD > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        data = data[RANK::WORLD]

    keras.utils.set_random_seed(0)  # the same initial weights on every process
    if BACKEND == "tensorflow":
        import tensorflow as tf

        SEEN.append(tf.Variable(0, dtype=tf.int64, trainable=False))  # outside any strategy: this process's
    with scope or contextlib.nullcontext():
        model = Packed()
        model.compile(optimizer=keras.optimizers.SGD(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    counter = StepCount()
    model.fit(data, batch_size=batch, epochs=args.epochs, validation_data=val, callbacks=[counter], verbose=0)

    if BACKEND == "tensorflow":
        samples = int(SEEN[0].numpy())
    elif BACKEND == "jax":  # traced once, so not counted in train_step: every row of this process's shard, each epoch
        samples = len(data) * args.epochs
    else:
        samples = sum(SEEN)
    print(f"rank {RANK}: {counter.steps} steps, {samples} samples on {BACKEND}", flush=True)
    if args.counts:
        with open(f"{args.counts}.{RANK}", "w") as out:
            json.dump({"steps": counter.steps, "samples": samples}, out)
    if BACKEND == "torch" and WORLD > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
