"""A data-parallel JAX training loop measured by dtpo: one ``Tracker`` and one ``tracker.step(...)`` per step.

    dtpo launch --framework jax --nproc-per-node 2 examples/jax_data_parallel.py --steps 200
    dtpo launch --framework jax --nproc-per-node 2 --tune power-limit examples/jax_data_parallel.py --steps 2000
"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dtpo.jax import Tracker

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=32, help="samples per step on each process")
args = parser.parse_args()

if int(os.environ.get("WORLD_SIZE", 1)) > 1:
    jax.distributed.initialize()  # dtpo launch fills in the coordinator, the process count and this process's id
mesh = Mesh(np.array(jax.devices()), ("data",))
rows, replicated = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
w = jax.device_put(jnp.zeros((16, 1)), replicated)
true_w = np.arange(16, dtype=np.float32).reshape(16, 1) / 16
rng = np.random.default_rng(jax.process_index())


@jax.jit
def train_step(w, x, y):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)  # the mean over the global batch
    return w - 0.1 * grad, loss


with Tracker(total_steps=args.steps) as tracker:
    for _ in range(args.steps):
        local_x = rng.standard_normal((args.batch_size, 16)).astype(np.float32)  # this process's share
        x = jax.make_array_from_process_local_data(rows, local_x)
        y = jax.make_array_from_process_local_data(rows, local_x @ true_w)
        w, loss = train_step(w, x, y)
        tracker.step(loss, batch=x)  # samples: the rows of x on this process
