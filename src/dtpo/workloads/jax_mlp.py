"""The built-in JAX workload: an MLP learning a random teacher's labels, data-parallel over every process.

Run by ``dtpo train --framework jax`` (through ``dtpo launch --framework jax -m dtpo.workloads.jax_mlp``), or
alone::

    python -m dtpo.workloads.jax_mlp --steps 200 --batch-size 128 [--lr 0.05] [--seed 0]

Each process generates its own batches (``--batch-size`` rows per process) and hands them to JAX as its share of
one global batch (``jax.make_array_from_process_local_data`` over a one-axis ``Mesh`` of every device); the
parameters are replicated, and one ``jax.jit`` step computes the loss over the global batch, so XLA all-reduces
the gradients. Plain SGD, written out (no optax). Each step is reported to dtpo through
:class:`~dtpo.frameworks.jax_tracker.Tracker`, with XLA's FLOPs for MFU.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dtpo.core.logs import configure_logging
from dtpo.frameworks.jax_tracker import Tracker, step_flops
from dtpo.workloads.framework_args import parse_workload_args

log = logging.getLogger("dtpo.workloads.jax_mlp")  # also when run as __main__ (python -m)

TEACHER_SEED = 20_240_601  # fixed so every process and every run learns the same task
IN_FEATURES, HIDDEN, DEPTH, CLASSES = 64, 256, 2, 10

Params = list[tuple[jax.Array, jax.Array]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The workload's flags (:func:`~dtpo.workloads.framework_args.parse_workload_args`)."""
    return parse_workload_args("dtpo.workloads.jax_mlp", __doc__.splitlines()[0], argv)


def init_params(key: jax.Array) -> Params:
    """The student's layers: ``DEPTH`` hidden ReLU layers of ``HIDDEN`` units, then the class logits."""
    sizes = [IN_FEATURES] + [HIDDEN] * DEPTH + [CLASSES]
    keys = jax.random.split(key, len(sizes) - 1)
    return [(jax.random.normal(k, (n_in, n_out)) * jnp.sqrt(2.0 / n_in), jnp.zeros(n_out))
            for k, n_in, n_out in zip(keys, sizes[:-1], sizes[1:], strict=True)]


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean cross-entropy of the student's logits against the labels."""
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    logits = x @ w + b
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def make_train_step(lr: float) -> Any:
    """One jitted SGD step: ``(params, x, y) -> (params, loss)``."""

    @jax.jit
    def train_step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

    return train_step


def local_batches(batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """This process's endless batches: Gaussian inputs labelled by a fixed random tanh teacher."""
    teacher = np.random.default_rng(TEACHER_SEED)
    w1 = teacher.standard_normal((IN_FEATURES, 64)) / IN_FEATURES**0.5
    w2 = teacher.standard_normal((64, CLASSES)) / 8.0
    rng = np.random.default_rng([seed, jax.process_index()])
    while True:
        x = rng.standard_normal((batch_size, IN_FEATURES)).astype(np.float32)
        yield x, (np.tanh(x @ w1) @ w2).argmax(axis=1).astype(np.int32)


def train(steps: int, batch_size: int, lr: float, seed: int) -> float:
    """Train for ``steps`` steps, reporting each to dtpo. Returns the last step's loss."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows, replicated = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    params = jax.jit(init_params, out_shardings=replicated)(jax.random.key(seed))
    train_step = make_train_step(lr)
    batches = local_batches(batch_size, seed)

    def global_batch() -> tuple[jax.Array, jax.Array]:
        x, y = next(batches)
        return (jax.make_array_from_process_local_data(rows, x), jax.make_array_from_process_local_data(rows, y))

    x, y = global_batch()
    first = loss = None
    with Tracker(total_steps=steps, flops_per_step=step_flops(train_step, params, x, y),
                 config={"workload": "jax_mlp", "batch_size": batch_size, "lr": lr, "seed": seed}) as tracker:
        for step in range(steps):
            if step:
                x, y = global_batch()
            params, loss = train_step(params, x, y)
            tracker.step(loss, batch=x)
            if step == 0:
                first = loss
    assert first is not None and loss is not None
    if jax.process_index() == 0:
            log.info("jax_mlp: loss %.4f after the first step, %.4f after step %d", float(first), float(loss), steps)
    return float(loss)


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, join the other processes (``WORLD_SIZE`` > 1), train."""
    args = parse_args(argv)
    configure_logging()
    if int(os.environ.get("WORLD_SIZE", 1) or 1) > 1:
        jax.distributed.initialize()
    train(args.steps, args.batch_size, args.lr, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
