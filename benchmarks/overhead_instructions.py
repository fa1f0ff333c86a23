"""The Session's own code per step, counted by a cache simulator: instructions and misses, the same in every run.

``benchmarks/overhead.py`` judges the Session's bookkeeping in CPU time, which on a small shared machine moves by
a fifth from one run to the next with the state of the machine, more than most changes to the Session's code. This
script counts what that code does instead: it runs the loop of ``overhead.py``'s small models under valgrind's
callgrind with its cache simulation on, and collects only inside the stretches of dtpo code that the bookkeeping
counter (:mod:`dtpo.session.loop.bookkeeping`) marks, on every measured step: instructions (Ir), first-level
instruction and data misses, and misses of a second level sized as this machine's L2 (512 KiB by default: after a
step's model work the Session's code and data are mostly out of it, which is most of what a step of dtpo costs).
The partial record's flush every 30 s of wall time is off (under valgrind, 50 times slower, it would land every few
dozen steps, where a real run spreads it over thousands). The simulation is deterministic, but the sampler thread's
timing is not: two runs of nearly the same code differed by 1 to 5 % (Linear(8, 4) moved by 1.5 thousand
instructions a step in one direction while the 32-layer model moved by 0.5 thousand in the other), so a change
shows in one run once it is larger than that, and in a few runs below it, where the CPU-time benchmark needs many.

The collection is switched on and off by callgrind's client requests (a five-line C helper compiled here with the
system's ``gcc`` and valgrind's ``callgrind.h``), each costing some instructions of its own inside the stretch;
a run that switches twice in a row at every step's start (an empty stretch) measures that share, and it is taken
off each stretch (the net columns). The estimated cycles weigh a first-level miss 10 cycles and a second-level
miss 60 (an estimate, printed as one: no hardware counter is read).

No goal: a diagnostic. Exits 2 when valgrind, gcc or callgrind.h is missing.

    python benchmarks/overhead_instructions.py [--steps 200] [--models linear,deep] [--l2-kib 512]
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_cli import OneLineParser, bad_flag
from rich.console import Console
from rich.table import Table

HELPER = """#include <valgrind/callgrind.h>
void dtpo_cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void dtpo_cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void dtpo_cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""
MODELS = {"linear": ("Linear(8,4)", 1, 8), "deep": ("32xLinear(8,8)", 32, 8)}
WARMUP_STEPS = 120  # uninstrumented: the FLOP count, the first windows, the caches of torch and Python
L1_MISS_CYCLES, L2_MISS_CYCLES = 10, 60


def child(helper: str, model: str, steps: int) -> None:
    """Inside valgrind: train ``model`` through a Session, collecting only inside the counter's stretches (or, for
    ``empty``, only between two switches at every step's start)."""
    import ctypes

    import torch
    import torch.nn.functional as F
    from overhead import small_model

    import dtpo
    from dtpo.session.callbacks.builtin import FlushCallback
    from dtpo.session.loop.bookkeeping import BookkeepingCounter

    lib = ctypes.PyDLL(helper)  # keeps the GIL: a switch is a plain call
    toggle = lib.dtpo_cg_toggle
    measuring = [False]
    empty = model == "empty"

    class Switching(BookkeepingCounter):
        """Counts every measured step, switching the collection on and off around each stretch."""

        __slots__ = ()

        def begin_step(self, step: int, warmup: bool = False) -> None:
            self.counting = measuring[0] and not warmup and not empty
            if measuring[0] and empty:
                toggle()
                toggle()
                self.stretches += 1
                self.steps += 1
            if self.counting:
                toggle()

        def enter(self) -> None:
            toggle()

        def leave(self) -> None:
            toggle()
            self.stretches += 1

        def step_done(self) -> None:
            self.steps += 1

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    _, layers, width = MODELS.get(model, MODELS["linear"])
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["DTPO_CACHE_DIR"] = str(Path(scratch) / "cache")
        session = dtpo.Session(progress=False, summary=False, run_dir=Path(scratch) / "run", flush_every=10**9,
                               energy=dtpo.EnergyConfig(sample_interval_s=0.1), count_flops=False)
        counter = session.bookkeeping = Switching(sample_one_in=1)
        for callback in session.callbacks:  # no flush every 30 s of wall time: under valgrind that is every few steps
            if isinstance(callback, FlushCallback):
                callback.every_s = float("inf")
        net = session.wrap(small_model(layers, width))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        rows = 64 if layers > 1 else 4
        x, y = torch.randn(rows, width), torch.randint(0, 4, (rows,))
        stream = iter(session.batches(itertools.repeat((x, y))))

        def run(n: int) -> None:
            for _ in range(n):
                bx, by = next(stream)
                session.backward(F.cross_entropy(net(bx), by))
                session.step(opt)

        run(WARMUP_STEPS)
        lib.dtpo_cg_start()
        run(20)  # the simulated caches fill
        measuring[0] = True
        run(steps)
        measuring[0] = False
        next(stream)  # the last step's end is counted; the next one starts no stretch
        lib.dtpo_cg_stop()
        print(f"counted {counter.steps} {counter.stretches}", file=sys.stderr, flush=True)
        os._exit(0)  # no finish: its report is not what is measured, and valgrind would run it slowly


def totals(path: Path) -> dict[str, int]:
    """The events callgrind summed in one thread's output file (its ``totals:`` line, at the end)."""
    events: list[str] = []
    found: dict[str, int] | None = None
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            found = dict(zip(events, map(int, line.split()[1:]), strict=False))
    if found is None:
        raise RuntimeError(f"no totals in {path}")
    return found


def measure(helper: Path, model: str, steps: int, l2_bytes: int, scratch: Path) -> dict[str, float]:
    """One callgrind run: the main thread's events per counted step and per stretch."""
    out = scratch / f"callgrind.{model}"
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no", "--cache-sim=yes",
               "--separate-threads=yes", f"--LL={l2_bytes},8,64", f"--callgrind-out-file={out}",
               sys.executable, __file__, "--child", str(helper), model, str(steps)]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    counted = [line.split() for line in done.stderr.splitlines() if line.startswith("counted ")]
    if done.returncode != 0 or not counted:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the {model} run failed (exit {done.returncode}): {tail}")
    n_steps, n_stretches = int(counted[0][1]), int(counted[0][2])
    events = totals(out.with_name(out.name + "-01"))  # thread 1: the training loop
    l1 = events.get("I1mr", 0) + events.get("D1mr", 0) + events.get("D1mw", 0)
    l2 = events.get("ILmr", 0) + events.get("DLmr", 0) + events.get("DLmw", 0)
    cycles = events.get("Ir", 0) + L1_MISS_CYCLES * l1 + L2_MISS_CYCLES * l2
    return {"steps": n_steps, "stretches": n_stretches / n_steps, "ir": events.get("Ir", 0) / n_steps,
            "l1": l1 / n_steps, "l2": l2 / n_steps, "cycles": cycles / n_steps}


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="measured steps per model (default 200)")
    parser.add_argument("--models", default="linear,deep", help="comma-separated: linear, deep")
    parser.add_argument("--l2-kib", type=int, default=512, help="the simulated second level, KiB (default 512)")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.steps < 10:
        bad_flag(parser.prog, f"--steps must be >= 10, got {args.steps}")
    if not models or any(m not in MODELS for m in models):
        bad_flag(parser.prog, f"--models must name some of {', '.join(MODELS)}, got {args.models!r}")
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            bad_flag(parser.prog, f"{tool} not found: install it (Debian: apt-get install {tool})")
    if not Path("/usr/include/valgrind/callgrind.h").exists():
        bad_flag(parser.prog, "valgrind/callgrind.h not found: install valgrind's headers")
    console = Console(width=max(Console().width, 100))
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        helper = scratch / "libdtpo_cg.so"
        (scratch / "helper.c").write_text(HELPER)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(helper), str(scratch / "helper.c")], check=True)
        results = {}
        with console.status("callgrind: the empty stretch, then each model (about a minute each)"):
            for model in ["empty", *models]:
                try:
                    results[model] = measure(helper, model, args.steps, args.l2_kib * 1024, scratch)
                except RuntimeError as exc:
                    bad_flag(parser.prog, str(exc))
    empty = results.pop("empty")
    table = Table(title=f"dtpo.Session's own code per step, simulated caches (L2 {args.l2_kib} KiB), "
                        f"{args.steps} steps")
    for column in ("model", "stretches", "Ir", "L1 miss", "L2 miss", "cycles*", "Ir net", "cycles* net"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for model, r in results.items():
        share = r["stretches"]  # the switches' own share of each stretch, as an empty stretch measured it
        table.add_row(MODELS[model][0], f"{r['stretches']:.1f}", f"{r['ir']:,.0f}", f"{r['l1']:,.0f}",
                      f"{r['l2']:,.0f}", f"{r['cycles']:,.0f}", f"{r['ir'] - share * empty['ir']:,.0f}",
                      f"{r['cycles'] - share * empty['cycles']:,.0f}")
    table.add_row("empty stretch", "1.0", f"{empty['ir']:,.0f}", f"{empty['l1']:,.0f}",
                  f"{empty['l2']:,.0f}", f"{empty['cycles']:,.0f}", "", "")
    console.print(table)
    console.print("* estimated: Ir + 10 per L1 miss + 60 per L2 miss (a model, not a hardware count). Net: less "
                  "the switches' own share, an empty stretch's for each stretch.")


if __name__ == "__main__":
    main()
