"""The command line of the other frameworks' built-in workloads (``python -m dtpo.workloads.jax_mlp``,
``tf_mlp``, ``keras_mlp``: what ``dtpo train --framework`` runs): ``--steps --batch-size --lr --seed``, a bad
value in one line with exit status 2."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import NoReturn


class _Parser(argparse.ArgumentParser):
    """Argument errors in one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_workload_args(prog: str, description: str, argv: Sequence[str] | None = None, *, steps: int = 200,
                        batch_size: int = 128, lr: float = 0.05, optimizer: str = "SGD") -> argparse.Namespace:
    """The workload's flags with its defaults; a bad one ends the process with one line and exit status 2.

    Args:
        prog: The module, as the error names it.
        description: One line for ``--help``.
        argv: The arguments (default: ``sys.argv[1:]``).
        steps: Default training steps.
        batch_size: Default samples per step on each process.
        lr: Default learning rate.
        optimizer: The optimizer the learning rate is for, for ``--help``.
    """
    parser = _Parser(prog=prog, description=description)
    parser.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    parser.add_argument("--batch-size", type=int, default=batch_size,
                        help=f"samples per step on each process (default {batch_size})")
    parser.add_argument("--lr", type=float, default=lr, help=f"{optimizer} learning rate (default {lr:g})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default 0)")
    args = parser.parse_args(None if argv is None else list(argv))
    for name in ("steps", "batch_size"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a number > 0, got {args.lr}")
    return args
