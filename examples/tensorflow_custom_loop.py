"""A TensorFlow custom training loop (``tf.function`` + ``strategy.run``) measured by dtpo: one tracker, one
call per step. ``MultiWorkerMirroredStrategy`` reads ``TF_CONFIG``, which ``dtpo launch`` writes for each worker
(without it: one worker)::

    python examples/tensorflow_custom_loop.py --steps 200
    dtpo launch --framework tensorflow --standalone --nproc-per-node 2 examples/tensorflow_custom_loop.py
"""

from __future__ import annotations

import argparse

import tensorflow as tf

import dtpo.tensorflow


def main(argv: list[str] | None = None) -> None:
    """Train a small classifier on generated data for ``--steps`` steps, reporting each step to dtpo."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps to run")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per step on each replica")
    parser.add_argument("--run-dir", help="where the record goes (default: the launch's, or runs/<run-id>)")
    args = parser.parse_args(argv)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    x = tf.random.stateless_normal((4096, 32), seed=(0, 0))
    y = tf.argmax(x[:, :10], axis=1)  # a rule the model can learn
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batches = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))  # each worker's share

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(128, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        optimizer = tf.keras.optimizers.SGD(0.05)

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True)
            loss = tf.nn.compute_average_loss(per_sample, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=batch), axis=None)

    # --- the dtpo part: one `with` and one call per step ------------------------------------------------------
    with dtpo.tensorflow.Tracker(total_steps=args.steps, run_dir=args.run_dir) as tracker:
        for _ in range(args.steps):
            batch = next(batches)
            tracker.step(train_step(batch), batch=batch)  # waits for the device only where a window closes
    # -----------------------------------------------------------------------------------------------------------


if __name__ == "__main__":
    main()
