"""``dtpo launch``: run any training script through torchrun, measured per step by dtpo's in-process agent
(:mod:`dtpo.agent`) unless ``--no-agent``, with dtpo's record at the end."""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import typer

from dtpo.cli.conclude import conclude_run, end_run
from dtpo.cli.register import register_record
from dtpo.core.config import CONFIG_FILE, RunConfig
from dtpo.core.frameworks import computes_on

log = logging.getLogger(__name__)

HELP = ("Run SCRIPT (PyTorch, JAX, TensorFlow or Keras: --framework) on many processes and machines through "
        "torch.distributed.run, measured per step with no code change (--no-agent: not measured). Takes every "
        "torchrun flag (--nnodes, --nproc-per-node, --node-rank, --rdzv-*, --max-restarts, --standalone, "
        "--master-addr, --master-port) and dtpo's --run-dir, --overwrite, --backend, --rdzv-timeout, --framework, "
        "--coordinator-port, --tune, --cost, --knob-mode, --metrics-addr. `dtpo launch --help` lists them all.")


def launch_command(ctx: typer.Context) -> None:
    """Run SCRIPT [ARGS...] on many processes and machines through torch.distributed.run."""
    from dtpo.agent import BOOT_DIR
    from dtpo.agent.activation import samples_per_step
    from dtpo.distributed.launch import launch  # torch: imported only when launching
    from dtpo.distributed.launch_args import parse_launch_args

    args = parse_launch_args(list(ctx.args))
    agent = not args.no_agent
    if agent:
        samples_per_step()  # a bad DTPO_SAMPLES_PER_STEP stops here, in one line
    with tempfile.TemporaryDirectory(prefix="dtpo-launch-config-") as scratch:
        config = agent_config(args, Path(scratch)) if agent else None
        outcome = launch(args, config=config, agent_path=BOOT_DIR)
    record = conclude_run(outcome) if outcome.recorded and outcome.run_dir is not None else None
    if record is not None and outcome.run_dir is not None:
        register_record(record, outcome.run_dir)
    end_run(outcome, record, args.training_script, agent=agent, framework=computes_on(args.framework))


def agent_config(args: argparse.Namespace, folder: Path) -> Path | None:
    """The agent's configuration file for ``--tune``/``--cost``/``--knob-mode``/``--metrics-addr`` (``None``
    without them: the agent's defaults), checked as ``dtpo train`` checks its own (a bad cost, no GPU to tune, an
    address in use: one line).

    Raises:
        ConfigError: What ``dtpo train`` would refuse.
    """
    if args.tune is None and args.metrics_addr is None:
        return None
    from dtpo.cli.train import check_tuning

    tune = ({"knob": args.tune} if args.tune is not None else {}) | (
        {"cost": args.cost} if args.cost is not None else {})
    knobs = {"mode": args.knob_mode} if args.knob_mode is not None else {}
    config = RunConfig().replace(tune=tune, knobs=knobs, telemetry={"metrics_addr": args.metrics_addr})
    check_tuning(config)
    if args.metrics_addr is not None:  # an address in use fails here, not in a worker
        from dtpo.telemetry.metrics_server import check_metrics_addr

        check_metrics_addr(args.metrics_addr)
    return config.save(folder / CONFIG_FILE)
