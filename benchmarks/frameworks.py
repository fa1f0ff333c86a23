"""Overhead of dtpo's step reporting in JAX, TensorFlow and Keras loops (goal: step-time ratio dtpo/plain <= 1.02
for each framework), and dtpo's step and sample counts against the loop's own (they must match exactly).

For every framework the same small model (an MLP on synthetic data, one process, one compute thread) trains for
the same steps three ways in every pair, in a random order drawn anew for every pair, each in a fresh process:

* ``plain``: the framework's own loop, no dtpo import (the reference),
* ``plain-aa``: the same again (the A/A control: its ratio to the reference is the harness's own noise),
* ``dtpo``: the same loop reporting each step to dtpo (JAX: ``dtpo.jax.Tracker``; TensorFlow's custom loop:
  ``dtpo.tensorflow.Tracker``; Keras's ``Model.fit``: ``dtpo.keras.DtpoCallback``, what ``dtpo launch`` adds),
  with energy, windows, partial-record flushes and the record as in any run.

A run's step time is the wall time of its training loop after ``--warmup`` steps (compilation excluded) divided
by the steps, ending with the device's work done (``block_until_ready`` / reading the loss back), with the same
for the process's CPU time. The verdict for a framework is the median over pairs of each pair's ratio
``dtpo/plain``, beside the same for the A/A control; when the A/A control is outside +-2 %, the machine was too
noisy for a verdict on that framework: exit 1 without one.

    python benchmarks/frameworks.py [--pairs 5] [--steps 300] [--warmup 30] [--width 512] [--batch 256]
                                    [--frameworks jax,tensorflow,keras-jax,keras-tensorflow]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.02
NOISE = 0.02
ARMS = ("plain", "plain-aa", "dtpo")
FRAMEWORKS = ("jax", "tensorflow", "keras-jax", "keras-tensorflow")
HERE = Path(__file__).resolve()


# -- the workloads: one loop per framework, timed the same way in every arm --------------------------------------


def run_jax(args: argparse.Namespace, reporter: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    params = [jax.random.normal(k, shape) * 0.02 for k, shape in
              ((k1, (args.width, args.width)), (k2, (args.width, args.width)), (k3, (args.width, 10)))]

    @jax.jit
    def train_step(params: list, x: jax.Array, y: jax.Array) -> tuple[list, jax.Array]:
        def loss_fn(params: list) -> jax.Array:
            h = jnp.tanh(x @ params[0])
            h = jnp.tanh(h @ params[1])
            logits = h @ params[2]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return [p - 0.01 * g for p, g in zip(params, grads, strict=True)], loss

    rng = np.random.default_rng(0)
    batches = [(jnp.asarray(rng.standard_normal((args.batch, args.width), dtype=np.float32)),
                jnp.asarray(rng.integers(0, 10, args.batch))) for _ in range(8)]
    tracker = None
    if reporter:
        from dtpo.jax import Tracker

        tracker = Tracker(total_steps=args.steps, run_dir=args.run_dir, progress=False, summary=False)
    loss = None
    for i in range(args.warmup):
        params, loss = train_step(params, *batches[i % 8])
        if tracker is not None:
            tracker.step(loss, samples=args.batch)
    jax.block_until_ready(loss)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(args.warmup, args.steps):
        params, loss = train_step(params, *batches[i % 8])
        if tracker is not None:
            tracker.step(loss, samples=args.batch)
    jax.block_until_ready(loss)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if tracker is not None:
        tracker.finish()
    return {"wall_s": wall, "cpu_s": cpu}


def run_tensorflow(args: argparse.Namespace, reporter: bool) -> dict:
    import numpy as np
    import tensorflow as tf

    tf.random.set_seed(0)
    layers = [tf.Variable(tf.random.normal(shape, stddev=0.02)) for shape in
              ((args.width, args.width), (args.width, args.width), (args.width, 10))]

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            h = tf.tanh(x @ layers[0])
            h = tf.tanh(h @ layers[1])
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, h @ layers[2]))
        for var, grad in zip(layers, tape.gradient(loss, layers), strict=True):
            var.assign_sub(0.01 * grad)
        return loss

    rng = np.random.default_rng(0)
    batches = [(tf.constant(rng.standard_normal((args.batch, args.width), dtype=np.float32)),
                tf.constant(rng.integers(0, 10, args.batch))) for _ in range(8)]
    tracker = None
    if reporter:
        from dtpo.tensorflow import Tracker

        tracker = Tracker(total_steps=args.steps, run_dir=args.run_dir, progress=False, summary=False)
    loss = None
    for i in range(args.warmup):
        loss = train_step(*batches[i % 8])
        if tracker is not None:
            tracker.step(loss, samples=args.batch)
    float(loss)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(args.warmup, args.steps):
        loss = train_step(*batches[i % 8])
        if tracker is not None:
            tracker.step(loss, samples=args.batch)
    float(loss)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if tracker is not None:
        tracker.finish()
    return {"wall_s": wall, "cpu_s": cpu}


def run_keras(args: argparse.Namespace, reporter: bool) -> dict:
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((args.width,)), keras.layers.Dense(args.width, activation="tanh"),
                              keras.layers.Dense(args.width, activation="tanh"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch * args.steps, args.width), dtype=np.float32)
    y = rng.integers(0, 10, args.batch * args.steps)

    class Clock(keras.callbacks.Callback):
        """Starts the clocks at the end of the warm-up batches; the fit's end stops them."""

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            if batch == args.warmup - 1:
                self.wall, self.cpu = time.perf_counter(), time.process_time()

    clock = Clock()
    callbacks: list = [clock]
    if reporter:
        from dtpo.keras import DtpoCallback

        callbacks.insert(0, DtpoCallback(run_dir=args.run_dir, progress=False, summary=False))
    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    return {"wall_s": time.perf_counter() - clock.wall, "cpu_s": time.process_time() - clock.cpu}


def worker(argv: list[str]) -> None:
    """One run of one arm (``--worker FRAMEWORK``): times written to ``--out`` as JSON."""
    parser = argparse.ArgumentParser(prog="frameworks.py --worker")
    parser.add_argument("--worker", choices=FRAMEWORKS, required=True)
    parser.add_argument("--arm", choices=ARMS, required=True)
    for name in ("steps", "warmup", "width", "batch"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    framework = args.worker
    runner = run_jax if framework == "jax" else run_tensorflow if framework == "tensorflow" else run_keras
    times = runner(args, reporter=args.arm == "dtpo")
    times["steps"] = args.steps - args.warmup
    Path(args.out).write_text(json.dumps(times))


def environment(framework: str) -> dict[str, str]:
    """One compute thread for every framework, Keras on the backend the framework's name ends with."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
           "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
           "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    if framework.startswith("keras-"):
        env["KERAS_BACKEND"] = framework.removeprefix("keras-")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DTPO_CONFIG", "DTPO_RUN_DIR"):
        env.pop(name, None)
    return env


def run_once(framework: str, arm: str, folder: Path, args: argparse.Namespace) -> dict:
    """One run in a fresh process; for the ``dtpo`` arm, the record's counts beside the loop's own."""
    run_dir, out = folder / f"{framework}-{arm}-{time.monotonic_ns()}", folder / "times.json"
    command = [sys.executable, str(HERE), "--worker", framework, "--arm", arm, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--width", str(args.width), "--batch", str(args.batch),
               "--run-dir", str(run_dir), "--out", str(out)]
    done = subprocess.run(command, env=environment(framework), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{framework} {arm} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    times = json.loads(out.read_text())
    if arm == "dtpo":
        record = json.loads((run_dir / "record.json").read_text())
        (rank,) = record["ranks"]
        times["counted"] = (len(rank["steps"]), sum(step["samples"] for step in rank["steps"]))
        times["own"] = (args.steps, args.steps * args.batch)
    return times


def main(argv: list[str]) -> int:
    if "--worker" in argv:
        worker(argv)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.frameworks.split(",") if name.strip()]
    unknown = set(chosen) - set(FRAMEWORKS)
    if unknown or args.pairs < 1 or not 0 < args.warmup < args.steps:
        parser.error(f"--frameworks from {', '.join(FRAMEWORKS)}; --pairs >= 1; 0 < --warmup < --steps")
    from rich.console import Console
    from rich.table import Table

    console = Console()
    shuffle = random.Random(args.seed)
    results: dict[str, dict[str, list[dict]]] = {name: {arm: [] for arm in ARMS} for name in chosen}
    with tempfile.TemporaryDirectory(prefix="dtpo-bench-frameworks-") as scratch:
        for pair in range(args.pairs):
            for framework in chosen:
                arms = list(ARMS)
                shuffle.shuffle(arms)
                for arm in arms:
                    results[framework][arm].append(run_once(framework, arm, Path(scratch), args))
            console.print(f"pair {pair + 1}/{args.pairs} done", highlight=False)
    table = Table(title=f"dtpo step reporting vs the plain loop ({args.pairs} pairs, {args.steps - args.warmup} "
                  f"timed steps, MLP width {args.width}, batch {args.batch}, 1 thread)")
    for column in ("framework", "plain step", "dtpo/plain wall", "A/A wall", "dtpo/plain CPU", "A/A CPU",
                   "counts (dtpo = own)", "verdict"):
        table.add_column(column, justify="left" if column in ("framework", "verdict") else "right")
    failed = False
    for framework in chosen:
        runs = results[framework]

        def ratio(arm: str, key: str, runs: dict = runs) -> float:
            return statistics.median(a[key] / p[key] for a, p in zip(runs[arm], runs["plain"], strict=True))

        wall, aa_wall = ratio("dtpo", "wall_s"), ratio("plain-aa", "wall_s")
        cpu, aa_cpu = ratio("dtpo", "cpu_s"), ratio("plain-aa", "cpu_s")
        counts_ok = all(run["counted"] == run["own"] for run in runs["dtpo"])
        step_ms = statistics.median(run["wall_s"] / run["steps"] for run in runs["plain"]) * 1e3
        if not counts_ok:
            verdict = "FAIL counts"
        elif abs(aa_wall - 1) > NOISE:
            verdict = "NO VERDICT (A/A noisy)"
        elif wall <= GOAL:
            verdict = f"ok <= {GOAL}"
        else:
            verdict = f"FAIL > {GOAL}"
        failed |= not verdict.startswith("ok")
        counted = runs["dtpo"][0]["counted"]
        table.add_row(framework, f"{step_ms:.2f} ms", f"{wall:.4f}", f"{aa_wall:.4f}", f"{cpu:.4f}", f"{aa_cpu:.4f}",
                      f"{counted[0]} steps, {counted[1]} samples" + ("" if counts_ok else " (differ)"), verdict)
    console.print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
