"""Overhead of dtpo's step reporting in JAX, TensorFlow and Keras loops (goal: step-time ratio dtpo/plain <= 1.02
for each framework), and dtpo's step and sample counts against the loop's own (they must match exactly).

For every framework one process (one compute thread) compiles a small model (an MLP on synthetic data) once and
then trains it in segments of ``--steps`` steps, three segments per round in an order drawn anew for every round:

* ``plain``: the framework's own loop, no dtpo call (the reference),
* ``plain-aa``: the same again (the A/A control: its ratio to the reference is the harness's own noise),
* ``dtpo``: the same loop reporting each step to dtpo, as a run of its own (JAX: ``dtpo.jax.Tracker``;
  TensorFlow's custom loop: ``dtpo.tensorflow.Tracker``; Keras's ``Model.fit``: ``dtpo.keras.DtpoCallback``,
  what ``dtpo launch`` adds), with energy, windows, partial-record flushes and the record as in any run.

Interleaving the arms in one process keeps what differs between processes (memory layout, which core, the
framework's thread pools) out of the ratio. A segment's time runs from its first step to the device's work done
(``block_until_ready`` / reading the loss back; Keras: from the first batch, with the queue drained, to the
epoch's end), wall and CPU; setting up and writing dtpo's record fall outside it. The verdict for a framework is
the median over rounds of each round's ratio ``dtpo/plain``, beside the same for the A/A control; when the A/A
control is outside +-2 %, the machine was too noisy for a verdict on that framework: exit 1 without one.

    python benchmarks/frameworks.py [--rounds 5] [--steps 1000] [--width 512] [--batch 256]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

GOAL = 1.02
NOISE = 0.02
ARMS = ("plain", "plain-aa", "dtpo")
FRAMEWORKS = ("jax", "tensorflow", "keras-jax", "keras-tensorflow")
HERE = Path(__file__).resolve()
QUIET = {"progress": False, "summary": False}

# A segment: (reporter or None) -> (wall s, CPU s, steps, samples); the reporter's run directory is the caller's.
Segment = Callable[[Path | None], tuple[float, float, int, int]]


# -- the workloads: one model per framework, compiled once, trained in segments timed the same way in every arm ---


def timed_loop(args: argparse.Namespace, run_dir: Path | None, tracker_class: Any, one_step: Callable[[int], Any],
               wait: Callable[[Any], Any]) -> tuple[float, float, int, int]:
    """``args.steps`` calls of ``one_step`` (it returns the step's loss), timed from the first to the device's
    work done (``wait`` on the last loss); each reported to a ``tracker_class`` run in ``run_dir``, if given,
    made before the clocks start and finished after they stop."""
    tracker = None
    if run_dir is not None:
        tracker = tracker_class(total_steps=args.steps, run_dir=run_dir, **QUIET)
        tracker.start()
    loss = None
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(args.steps):
        loss = one_step(i)
        if tracker is not None:
            tracker.step(loss, samples=args.batch)
    wait(loss)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if tracker is not None:
        tracker.finish()
    return wall, cpu, args.steps, args.steps * args.batch


def jax_segments(args: argparse.Namespace) -> Segment:
    import jax
    import jax.numpy as jnp
    import numpy as np

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    state = {"params": [jax.random.normal(k, shape) * 0.02 for k, shape in
                        zip(keys, ((args.width, args.width), (args.width, args.width), (args.width, 10)), strict=True)]}

    @jax.jit
    def train_step(params: list, x: jax.Array, y: jax.Array) -> tuple[list, jax.Array]:
        def loss_fn(params: list) -> jax.Array:
            h = jnp.tanh(jnp.tanh(x @ params[0]) @ params[1])
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(h @ params[2]), y[:, None], axis=1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return [p - 0.01 * g for p, g in zip(params, grads, strict=True)], loss

    rng = np.random.default_rng(0)
    batches = [(jnp.asarray(rng.standard_normal((args.batch, args.width), dtype=np.float32)),
                jnp.asarray(rng.integers(0, 10, args.batch))) for _ in range(8)]
    jax.block_until_ready(train_step(state["params"], *batches[0]))  # compiled before any segment

    def one_step(i: int) -> Any:
        state["params"], loss = train_step(state["params"], *batches[i % 8])
        return loss

    def segment(run_dir: Path | None) -> tuple[float, float, int, int]:
        from dtpo.jax import Tracker

        return timed_loop(args, run_dir, Tracker, one_step, jax.block_until_ready)

    return segment


def tensorflow_segments(args: argparse.Namespace) -> Segment:
    import numpy as np
    import tensorflow as tf

    tf.random.set_seed(0)
    layers = [tf.Variable(tf.random.normal(shape, stddev=0.02)) for shape in
              ((args.width, args.width), (args.width, args.width), (args.width, 10))]

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            h = tf.tanh(tf.tanh(x @ layers[0]) @ layers[1])
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, h @ layers[2]))
        for var, grad in zip(layers, tape.gradient(loss, layers), strict=True):
            var.assign_sub(0.01 * grad)
        return loss

    rng = np.random.default_rng(0)
    batches = [(tf.constant(rng.standard_normal((args.batch, args.width), dtype=np.float32)),
                tf.constant(rng.integers(0, 10, args.batch))) for _ in range(8)]
    float(train_step(*batches[0]))  # traced before any segment

    def segment(run_dir: Path | None) -> tuple[float, float, int, int]:
        from dtpo.tensorflow import Tracker

        return timed_loop(args, run_dir, Tracker, lambda i: train_step(*batches[i % 8]), float)

    return segment


def keras_segments(args: argparse.Namespace) -> Segment:
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
    model.fit(x[:args.batch * 2], y[:args.batch * 2], batch_size=args.batch, verbose=0)  # compiled first

    class Clock(keras.callbacks.Callback):
        """Starts the clocks where the first batch begins (the queue drained) and stops them at the epoch's end
        (its logs are read back: the device's work is done), before dtpo's record is written at the fit's end.
        It leaves ``on_train_batch_end`` alone: overriding it makes Keras read every step's logs back on the
        JAX and torch backends."""

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            if batch == 0:
                self.wall, self.cpu = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def segment(run_dir: Path | None) -> tuple[float, float, int, int]:
        clock = Clock()
        callbacks: list[Any] = [clock]
        if run_dir is not None:
            from dtpo.keras import DtpoCallback

            callbacks.insert(0, DtpoCallback(run_dir=run_dir, **QUIET))
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
        return clock.wall, clock.cpu, args.steps, args.steps * args.batch

    return segment


def worker(argv: list[str]) -> None:
    """One framework's rounds (``--worker FRAMEWORK``): every segment's times written to ``--out`` as JSON."""
    parser = argparse.ArgumentParser(prog="frameworks.py --worker")
    parser.add_argument("--worker", choices=FRAMEWORKS, required=True)
    for name in ("rounds", "steps", "width", "batch", "seed"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    framework = args.worker
    make = jax_segments if framework == "jax" else tensorflow_segments if framework == "tensorflow" else keras_segments
    segment = make(args)
    shuffle = random.Random(args.seed)
    rounds = []
    for index in range(args.rounds):
        arms = list(ARMS)
        shuffle.shuffle(arms)
        times: dict[str, dict[str, Any]] = {}
        for arm in arms:
            run_dir = Path(args.scratch) / f"{framework}-{index}" if arm == "dtpo" else None
            wall, cpu, steps, samples = segment(run_dir)
            times[arm] = {"wall_s": wall, "cpu_s": cpu}
            if run_dir is not None:
                (rank,) = json.loads((run_dir / "record.json").read_text())["ranks"]
                times[arm]["counted"] = [len(rank["steps"]), sum(step["samples"] for step in rank["steps"])]
                times[arm]["own"] = [steps, samples]
        rounds.append(times)
    Path(args.out).write_text(json.dumps(rounds))


def environment(framework: str) -> dict[str, str]:
    """One compute thread for every framework, Keras on the backend the framework's name ends with."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
           "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
           "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    if framework.startswith("keras-"):
        env["KERAS_BACKEND"] = framework.removeprefix("keras-")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DTPO_CONFIG", "DTPO_RUN_DIR",
                 "DTPO_LAUNCHED"):
        env.pop(name, None)
    return env


def run_framework(framework: str, args: argparse.Namespace, scratch: Path) -> list[dict[str, dict[str, Any]]]:
    """All rounds of one framework, in a process of their own."""
    out = scratch / f"{framework}.json"
    command = [sys.executable, str(HERE), "--worker", framework, "--rounds", str(args.rounds), "--steps",
               str(args.steps), "--width", str(args.width), "--batch", str(args.batch), "--seed", str(args.seed),
               "--scratch", str(scratch), "--out", str(out)]
    done = subprocess.run(command, env=environment(framework), capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{framework} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(out.read_text())


def main(argv: list[str]) -> int:
    if "--worker" in argv:
        worker(argv)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000, help="steps per segment")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.frameworks.split(",") if name.strip()]
    if set(chosen) - set(FRAMEWORKS) or args.rounds < 1 or args.steps < 20:
        parser.error(f"--frameworks from {', '.join(FRAMEWORKS)}; --rounds >= 1; --steps >= 20")
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(title=f"dtpo step reporting vs the plain loop ({args.rounds} rounds of {args.steps} steps per arm, "
                  f"interleaved in one process; MLP width {args.width}, batch {args.batch}, 1 thread)")
    for column in ("framework", "plain step", "dtpo/plain wall", "A/A wall", "dtpo/plain CPU", "A/A CPU",
                   "counts (dtpo = own)", "verdict"):
        table.add_column(column, justify="left" if column in ("framework", "verdict") else "right")
    failed = False
    with tempfile.TemporaryDirectory(prefix="dtpo-bench-frameworks-") as scratch:
        for framework in chosen:
            rounds = run_framework(framework, args, Path(scratch))
            console.print(f"{framework}: {len(rounds)} rounds done", highlight=False)

            def ratio(arm: str, key: str, rounds: list = rounds) -> float:
                return statistics.median(r[arm][key] / r["plain"][key] for r in rounds)

            wall, aa_wall = ratio("dtpo", "wall_s"), ratio("plain-aa", "wall_s")
            cpu, aa_cpu = ratio("dtpo", "cpu_s"), ratio("plain-aa", "cpu_s")
            counts_ok = all(r["dtpo"]["counted"] == r["dtpo"]["own"] for r in rounds)
            step_ms = statistics.median(r["plain"]["wall_s"] for r in rounds) / args.steps * 1e3
            if not counts_ok:
                verdict = "FAIL counts"
            elif abs(aa_wall - 1) > NOISE:
                verdict = "NO VERDICT (A/A noisy)"
            elif wall <= GOAL:
                verdict = f"ok <= {GOAL}"
            else:
                verdict = f"FAIL > {GOAL}"
            failed |= not verdict.startswith("ok")
            steps, samples = rounds[0]["dtpo"]["counted"]
            table.add_row(framework, f"{step_ms:.2f} ms", f"{wall:.4f}", f"{aa_wall:.4f}", f"{cpu:.4f}",
                          f"{aa_cpu:.4f}", f"{steps} steps, {samples} samples" + ("" if counts_ok else " (differ)"),
                          verdict)
    console.print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
