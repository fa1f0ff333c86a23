"""The training script behind ``dtpo train``: one built-in workload, trained with :class:`dtpo.Session`.

It is an ordinary dtpo script and runs three ways::

    dtpo train --workload lm                       # 2 local workers through dtpo launch
    dtpo launch --nproc-per-node 4 -m dtpo.examples.train --workload cnn
    python -m dtpo.examples.train --workload mlp   # one plain process
"""

from __future__ import annotations

import argparse
import sys

import torch

import dtpo
from dtpo.core.errors import DtpoError
from dtpo.examples import get_workload
from dtpo.session.config import EnergyConfig, KnobConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's own flags (the same names as ``dtpo train``)."""
    parser = argparse.ArgumentParser(prog="dtpo.examples.train", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="lm")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the workload's)")
    parser.add_argument("--batch-size", type=int, default=None, help="per-worker micro-batch size")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the workload's)")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default=None)
    parser.add_argument("--no-energy", action="store_true", help="do not measure energy")
    parser.add_argument("--cpu-tdp", type=float, default=None, help="CPU TDP (W) for the modelled CPU")
    parser.add_argument("--grid-intensity", type=float, default=475.0, help="g CO2e per kWh")
    parser.add_argument("--price-per-kwh", type=float, default=None)
    parser.add_argument("--power-limit", type=float, default=None, help="GPU power limit (W) for the run")
    parser.add_argument("--sm-clock", type=int, default=None, help="lock GPU SM clocks at this MHz for the run")
    parser.add_argument("--knob-mode", default="apply", help="apply, dry-run or observe")
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> None:
    """Build the workload, train it for ``args.steps`` optimizer steps, write the record."""
    workload = get_workload(args.workload)
    steps = args.steps if args.steps is not None else workload.default_steps
    batch_size = args.batch_size if args.batch_size is not None else workload.default_batch_size
    lr = args.lr if args.lr is not None else workload.default_lr
    config = {"workload": workload.name, "steps": steps, "batch_size": batch_size, "lr": lr, "seed": args.seed}
    energy = EnergyConfig(enabled=not args.no_energy, cpu_tdp_w=args.cpu_tdp, grid_g_per_kwh=args.grid_intensity,
                          price_per_kwh=args.price_per_kwh)
    session = dtpo.Session(precision=args.precision, strategy=args.strategy, grad_accum=args.grad_accum,
                           warmup_steps=args.warmup_steps, run_dir=args.run_dir, config=config, energy=energy,
                           knobs=KnobConfig(args.power_limit, args.sm_clock, args.knob_mode))
    with session:
        torch.manual_seed(args.seed)  # identical initial replicas on every rank
        model = session.wrap(workload.build_model())
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        data = workload.batches(batch_size, session.rank, session.world_size, seed=args.seed)
        for inputs, targets in session.batches(data, steps=steps):
            loss = workload.loss(model(inputs), targets)
            session.backward(loss)
            session.step(optimizer)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one line and exit code 2 for a bad setting."""
    try:
        train(parse_args(argv))
    except DtpoError as exc:
        print(f"dtpo: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
