"""``dtpo train --engine ray``: the checks before the run directory is touched, and the launch through Ray Train
(the driver side of :mod:`dtpo.distributed.ray_engine`, with :func:`dtpo.workloads.ray_train.train_loop` on the
workers)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dtpo.core.config import CONFIG_FILE, RunConfig

if TYPE_CHECKING:
    from dtpo.distributed.launch import LaunchOutcome


def check_ray_engine(config: RunConfig) -> RunConfig:
    """Ray Train is importable and ``--ray-address`` answers (``auto`` looked up); nothing is written.

    Returns:
        ``config`` with ``launch.ray_address`` as ``ray.init`` takes it.

    Raises:
        ConfigError: One line (exit code 2).
    """
    from dtpo.distributed.ray_engine import check_ray_address, check_ray_installed

    check_ray_installed(connecting=config.launch.ray_address is not None)
    if config.launch.ray_address is None:
        return config
    return config.replace(launch={"ray_address": check_ray_address(config.launch.ray_address)})


def launch_ray_training(config: RunConfig, run_dir: Path) -> LaunchOutcome:
    """Train ``config`` (resolved and checked) on ``config.launch.workers`` Ray Train workers."""
    from dtpo.distributed.ray_engine import launch_on_ray
    from dtpo.workloads.ray_train import train_loop

    path = config.replace(launch={"run_dir": str(run_dir)}).save(run_dir / CONFIG_FILE)
    return launch_on_ray(train_loop, config, run_dir, path)
