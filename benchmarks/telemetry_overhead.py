"""Overhead of dtpo's live telemetry: step time with the Prometheus exporter, run store and traces on against off
(goal: median step-time ratio on/off <= 1.01).

Two gloo ranks train three copies of the same model through three ``dtpo.Session`` s: telemetry off (the
reference), telemetry off again (the A/A control: its ratio to the reference is the harness's own noise), and
telemetry on (``--metrics-addr 127.0.0.1:0``: every rank writes its metrics, local rank 0 serves them, while this
script scrapes the endpoint every ``--scrape-interval`` seconds from outside as Prometheus would; traces on;
the run registered in a run store). The three take turns step by step in a random order drawn anew for every
step, as in ``benchmarks/overhead.py``; a round is ``--block`` steps of each. The run store and the traces cost
nothing per step (they are written at the start and the end): their one-off cost is timed and printed apart.

    python benchmarks/telemetry_overhead.py [--rounds 150] [--block 8] [--width 1024] [--scrape-interval 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import cpu_seconds, describe, dtpo_step, interleaved_rounds, join_world, leave_world  # noqa: E402 - the sibling benchmark's loop and statistics

import dtpo  # noqa: E402
from dtpo.core.config import RunConfig, TelemetryConfig  # noqa: E402
from dtpo.core.record import RunRecord  # noqa: E402
from dtpo.telemetry.store.database import RunStore  # noqa: E402
from dtpo.telemetry.trace import write_traces  # noqa: E402

GOAL = 1.01
LOOPS = ("off", "off-aa", "on")


def session_for(name: str, out: str, telemetry: bool) -> dtpo.Session:
    """A Session of one loop: all three measure energy alike; only ``on`` exports metrics."""
    config = RunConfig(telemetry=TelemetryConfig(metrics_addr="127.0.0.1:0" if telemetry else None,
                                                 trace=telemetry, report=False))
    config = config.replace(session={"flush_every": 10**9})
    return dtpo.Session(run_config=config, run_dir=Path(out) / name, progress=False, summary=False)


def worker(rank: int, world: int, args: argparse.Namespace, out: str) -> None:
    join_world(rank, world, out)
    # Made in the order off, on, off-aa: a bias from the order of creation (memory placement, thread start)
    # then shows in the A/A control rather than hiding in the on/off ratio.
    sessions = {name: session_for(name, out, name == "on") for name in ("off", "on", "off-aa")}
    steps = {name: dtpo_step(args.width, rank, sessions[name]) for name in LOOPS}
    wall, cpu = interleaved_rounds(steps, args.rounds, args.block, rank)
    callback_s = time_metrics_callback(sessions["on"]) if rank == 0 else None
    for session in sessions.values():
        session.finish()
    everyone: list[dict | None] = [None] * world
    dist.all_gather_object(everyone, {"wall": wall, "cpu": cpu, "callback_s": callback_s})
    if rank == 0:
        Path(out, "times.json").write_text(json.dumps(everyone))
    sessions.clear()  # they hold the wrapped models too
    leave_world(steps)


def time_metrics_callback(session: dtpo.Session, calls: int = 5000) -> dict[str, float]:
    """CPU seconds per call of the metrics callback's step and window hooks on this rank (what telemetry adds to
    a step, measured directly rather than as a difference of two noisy step times)."""
    from dtpo.core.steps import Window
    from dtpo.session.callbacks.metrics import MetricsCallback

    [callback] = [c for c in session.callbacks if isinstance(c, MetricsCallback)]
    step = session.rank_record.steps[-1]
    window = Window(index=0, first_step=step.step, last_step=step.step, time_s=step.step_s, samples=step.samples,
                    step_time_s=step.step_s, energy_j={"cpu": 1.0}, sources={"cpu": "modelled"}, estimated=True,
                    settings={name: switch.value for name, switch in session.switches.items()})
    c0 = cpu_seconds()
    for _ in range(calls):
        callback.on_step_end(session, step)
    c1 = cpu_seconds()
    for _ in range(calls // 10):
        callback.on_window_end(session, window)
    c2 = cpu_seconds()
    return {"step": (c1 - c0) / calls, "window": (c2 - c1) / (calls // 10)}


def scrape_while(out: str, interval_s: float, stop: threading.Event, counts: dict[str, int]) -> None:
    """Scrape the ``on`` run's endpoint every ``interval_s`` seconds until ``stop`` (as Prometheus would)."""
    endpoints = Path(out, "on", "metrics")
    url = None
    while not stop.is_set():
        if url is None:
            found = list(endpoints.glob("*/endpoint.json"))
            if found:
                url = json.loads(found[0].read_text())["url"]
        if url is not None:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only
                    counts["bytes"] += len(response.read())
                    counts["scrapes"] += 1
            except OSError:
                counts["failed"] += 1
        stop.wait(interval_s if url else 0.2)


def one_off_costs(out: str) -> tuple[float, float]:
    """Seconds to register a run in a store and mark it finished; seconds to write the ``on`` run's traces."""
    record = RunRecord.load(Path(out, "on"))
    store_path = Path(out, "store.sqlite")
    t0 = time.perf_counter()
    store = RunStore.open(store_path)
    store.register(record.run_id, "train", Path(out, "on"), record.config)
    store.register_record(record, Path(out, "on"), "train")
    t1 = time.perf_counter()
    write_traces(record, Path(out, "again"))
    return t1 - t0, time.perf_counter() - t1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--block", type=int, default=8, help="steps of each loop per round")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--scrape-interval", type=float, default=5.0,
                        help="seconds between scrapes of the endpoint (Prometheus's default is 60, 15 is common)")
    args = parser.parse_args()
    console = Console(width=max(Console().width, 120))
    counts = {"scrapes": 0, "failed": 0, "bytes": 0}
    with tempfile.TemporaryDirectory() as out:
        os.environ.setdefault("DTPO_CACHE_DIR", str(Path(out) / "cache"))
        stop = threading.Event()
        scraper = threading.Thread(target=scrape_while, args=(out, args.scrape_interval, stop, counts), daemon=True)
        scraper.start()
        try:
            mp.spawn(worker, args=(2, args, out), nprocs=2, join=True)
        finally:
            stop.set()
            scraper.join(timeout=10)
        ranks = json.loads(Path(out, "times.json").read_text())
        store_s, trace_s = one_off_costs(out)
    wall = ranks[0]["wall"]
    rounds = range(args.rounds)

    def wall_ratios(name: str) -> list[float]:
        return [statistics.median(wall[name][r]) / statistics.median(wall["off"][r]) for r in rounds]

    def cpu_ratios(name: str) -> list[float]:
        return [sum(rk["cpu"][name][r] for rk in ranks) / sum(rk["cpu"]["off"][r] for rk in ranks) for r in rounds]

    table = Table(title=f"dtpo telemetry overhead (2 gloo ranks, {args.rounds} rounds x {args.block} steps, "
                        f"endpoint scraped every {args.scrape_interval:g} s: {counts['scrapes']} scrapes, "
                        f"{counts['failed']} failed)")
    for col in ("loop", "median step (rank 0)", "CPU per step (2 ranks)", "step ratio to off", "CPU ratio to off"):
        table.add_column(col, justify="right")
    labels = {"off": "telemetry off", "off-aa": "telemetry off again (A/A)",
              "on": "exporter + store + trace on"}
    for name in LOOPS:
        steps = [t for block in wall[name] for t in block]
        cpu_per_step = sum(sum(rk["cpu"][name]) for rk in ranks) / len(steps)
        table.add_row(labels[name], f"{statistics.median(steps) * 1e3:.3f} ms", f"{cpu_per_step * 1e3:.3f} ms",
                      "1" if name == "off" else f"{statistics.median(wall_ratios(name)):.4f}",
                      "1" if name == "off" else f"{statistics.median(cpu_ratios(name)):.4f}")
    console.print(table)
    ratio = statistics.median(wall_ratios("on"))
    console.print(f"step ratio on/off: {describe(wall_ratios('on'))}")
    console.print(f"A/A control:       {describe(wall_ratios('off-aa'))}")
    console.print(f"CPU ratio on/off:  {describe(cpu_ratios('on'))}")
    hooks = ranks[0]["callback_s"]
    window_steps = RunConfig().session.window_steps
    per_step = hooks["step"] + hooks["window"] / window_steps
    median_off = statistics.median(t for block in wall["off"] for t in block)
    console.print(f"metrics callback, timed directly on rank 0: {hooks['step'] * 1e6:.1f} us CPU per step + "
                  f"{hooks['window'] * 1e6:.1f} us per window of {window_steps} steps = {per_step * 1e6:.1f} us per "
                  f"step, {per_step / median_off:.3%} of the median step")
    console.print(f"one-off, outside the steps: run store register + finish {store_s * 1e3:.1f} ms; traces of "
                  f"{args.rounds * args.block + args.block} steps x 2 ranks {trace_s * 1e3:.1f} ms")
    met = ratio <= GOAL and counts["scrapes"] > 0
    console.print(f"{'met' if met else 'MISSED'}     step ratio with telemetry on <= {GOAL} (median {ratio:.4f})"
                  + ("" if counts["scrapes"] else "; the endpoint was never scraped"))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
