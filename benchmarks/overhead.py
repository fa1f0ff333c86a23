"""Overhead of dtpo.Session over a plain DDP loop (goal: median step-time ratio dtpo/plain <= 1.01).

Two gloo ranks train the same model on the same data with a plain DDP loop and with a dtpo Session,
alternating blocks of steps so that both see the same machine state. Each step is timed from the start of
one loop iteration to the start of the next, identically for both loops. The verdict is the median over
rounds of each round's ratio (its two blocks ran back to back); the quartiles show how noisy the machine
was. Prints a table and exits 1 when the goal is missed.

    python benchmarks/overhead.py [--rounds 40] [--block 10] [--width 1024] [--no-energy]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import dtpo

GOAL = 1.01


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def batches(width: int, rank: int):
    gen = torch.Generator().manual_seed(rank)
    pool = [(torch.randn(64, width, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    i = 0
    while True:
        yield pool[i % len(pool)]
        i += 1


def timed_plain(model: nn.Module, opt: torch.optim.Optimizer, data, steps: int) -> list[float]:
    times, last = [], time.perf_counter()
    for _ in range(steps):
        x, y = next(data)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


def timed_dtpo(session: dtpo.Session, model: nn.Module, opt: torch.optim.Optimizer, data, steps: int) -> list[float]:
    times, last = [], time.perf_counter()
    for x, y in session.batches(data, steps=steps):
        loss = F.cross_entropy(model(x), y)
        session.backward(loss)
        session.step(opt)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    plain = DistributedDataParallel(make_model(args.width))
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01)
    session = dtpo.Session(progress=False, summary=False, run_dir=Path(out) / "run", flush_every=10**9,
                           energy=args.energy)
    model = session.wrap(make_model(args.width))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plain_data, dtpo_data = batches(args.width, rank), batches(args.width, rank)
    timed_plain(plain, plain_opt, plain_data, args.block)  # warm both up
    timed_dtpo(session, model, opt, dtpo_data, args.block)
    plain_times, dtpo_times, round_ratios = [], [], []
    for r in range(args.rounds):
        # Alternate which loop goes first so neither always runs on a freshly idle machine.
        order = (("plain", "dtpo") if r % 2 == 0 else ("dtpo", "plain"))
        block: dict[str, list[float]] = {}
        for which in order:
            if which == "plain":
                block[which] = timed_plain(plain, plain_opt, plain_data, args.block)
            else:
                block[which] = timed_dtpo(session, model, opt, dtpo_data, args.block)
        plain_times += block["plain"]
        dtpo_times += block["dtpo"]
        round_ratios.append(statistics.median(block["dtpo"]) / statistics.median(block["plain"]))
        if rank == 0:
            print(f"\rround {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
    session.finish()
    if rank == 0:
        print(file=sys.stderr)
        Path(out, "times.json").write_text(json.dumps({"plain": plain_times, "dtpo": dtpo_times,
                                                            "ratios": round_ratios}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--no-energy", dest="energy", action="store_false",
                        help="measure the Session without energy measurement (to attribute an overhead)")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        os.environ.setdefault("DTPO_CACHE_DIR", str(Path(out) / "cache"))
        mp.spawn(worker, args=(2, port, args, out), nprocs=2, join=True)
        times = json.loads(Path(out, "times.json").read_text())
    plain, ours = statistics.median(times["plain"]), statistics.median(times["dtpo"])
    # Paired: each round's two blocks ran back to back, so their ratio cancels the machine's slow drift.
    ratios = sorted(times["ratios"])
    ratio = statistics.median(ratios)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
    table = Table(title="dtpo.Session overhead over plain DDP (2 gloo ranks, rank 0)")
    for col in ("loop", "steps", "median step", "mean step"):
        table.add_column(col, justify="right")
    table.add_row("plain DDP", str(len(times["plain"])), f"{plain * 1e3:.3f} ms",
                  f"{statistics.fmean(times['plain']) * 1e3:.3f} ms")
    table.add_row("dtpo.Session", str(len(times["dtpo"])), f"{ours * 1e3:.3f} ms",
                  f"{statistics.fmean(times['dtpo']) * 1e3:.3f} ms")
    console = Console()
    console.print(table)
    verdict = "met" if ratio <= GOAL else "MISSED"
    console.print(f"ratio of all steps' medians dtpo/plain: {ours / plain:.4f}")
    console.print(f"median over {len(ratios)} rounds of the per-round step-time ratio dtpo/plain: {ratio:.4f} "
                  f"(quartiles {quartiles[0]:.4f}-{quartiles[2]:.4f}; goal <= {GOAL}): {verdict}")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
