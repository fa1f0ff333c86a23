"""A TensorFlow custom training loop written as for TensorFlow alone: ``MultiWorkerMirroredStrategy`` finds the
cluster in ``TF_CONFIG``, each worker trains on data of its own, and the strategy all-reduces the gradients.
With ``--tracker`` it reports each step through ``dtpo.tensorflow.Tracker`` (one line); without, it does not
know dtpo at all. Each worker writes what it did to ``COUNTS.<task index>``: its steps and samples, the
``TF_CONFIG`` it was given, the replicas in sync, a checksum of its first batch and of the trained weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--counts", required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--tracker", action="store_true")
args = parser.parse_args()

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
index = int(tf_config.get("task", {}).get("index", 0))
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    # mirrored on every worker; an update in a replica sums the replicas' updates (the strategy's all-reduce)
    weights = tf.Variable(tf.zeros((8, 1)), name="weights", aggregation=tf.VariableAggregation.SUM)
global_batch = args.batch_size * strategy.num_replicas_in_sync


def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(tf.reduce_sum((x @ weights - y) ** 2, axis=1),
                                          global_batch_size=global_batch)
    weights.assign_sub(0.1 * tape.gradient(loss, weights))
    return loss


@tf.function
def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None)


if args.tracker:
    import dtpo.tensorflow

    tracking: contextlib.AbstractContextManager = dtpo.tensorflow.Tracker(total_steps=args.steps)
else:
    tracking = contextlib.nullcontext()
steps = samples = 0
first_batch = 0.0
with tracking as tracker:
    for step in range(args.steps):
        x = tf.random.stateless_normal((args.batch_size, 8), seed=(index, step))  # this worker's own data
        y = tf.reduce_sum(x, axis=1, keepdims=True) * (1.0 + index)
        loss = train_step(x, y)
        if tracker is not None:
            tracker.step(loss, samples=args.batch_size)
        steps, samples = steps + 1, samples + args.batch_size
        first_batch = first_batch or float(tf.reduce_sum(x))
Path(f"{args.counts}.{index}").write_text(json.dumps({
    "steps": steps, "samples": samples, "tf_config": tf_config, "replicas": strategy.num_replicas_in_sync,
    "first_batch": first_batch, "weights": weights.numpy().ravel().tolist()}))
