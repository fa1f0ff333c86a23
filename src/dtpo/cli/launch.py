"""``dtpo launch``: run any training script through torchrun, with dtpo's record at the end."""

from __future__ import annotations

import logging

import typer

from dtpo.cli.conclude import conclude_run, end_run

log = logging.getLogger(__name__)

HELP = ("Run SCRIPT on many processes and machines through torch.distributed.run. Takes every torchrun flag "
        "(--nnodes, --nproc-per-node, --node-rank, --rdzv-*, --max-restarts, --standalone, --master-addr, "
        "--master-port) and dtpo's --run-dir, --overwrite, --backend, --rdzv-timeout. `dtpo launch --help` lists "
        "them all.")


def launch_command(ctx: typer.Context) -> None:
    """Run SCRIPT [ARGS...] on many processes and machines through torch.distributed.run."""
    from dtpo.distributed.launch import launch, parse_launch_args  # torch: imported only when launching

    args = parse_launch_args(list(ctx.args))
    outcome = launch(args)
    record = conclude_run(outcome) if outcome.recorded and outcome.run_dir is not None else None
    end_run(outcome, record, args.training_script)

