"""``dtpo launch``: run any training script through torchrun, with dtpo's record at the end."""

from __future__ import annotations

import sys

import typer

from dtpo.cli.runs import conclude_run
from dtpo.dist.launch import launch, parse_launch_args

HELP = ("Run SCRIPT on many processes and machines through torch.distributed.run. Takes every torchrun flag "
        "(--nnodes, --nproc-per-node, --node-rank, --rdzv-*, --max-restarts, --standalone, --master-addr, "
        "--master-port) and dtpo's --run-dir, --backend, --rdzv-timeout. `dtpo launch --help` lists them all.")


def launch_command(ctx: typer.Context) -> None:
    """Run SCRIPT [ARGS...] on many processes and machines through torch.distributed.run."""
    args = parse_launch_args(list(ctx.args))
    outcome = launch(args)
    conclude_run(outcome)
    if outcome.failed:
        print(f"dtpo: run failed: {outcome.message}; record in {outcome.run_dir}", file=sys.stderr)
        raise typer.Exit(1)
