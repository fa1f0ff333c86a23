"""``dtpo launch``: torchrun's elastic launcher with dtpo's flags beside its own.

The parsing and launching are ``torch.distributed.run``'s own (``get_args_parser`` and ``run``), so every
torchrun flag works unchanged. dtpo adds a run directory, a backend override and one rendezvous timeout,
checks what it can before any process starts, and turns the launcher's failures into one-line errors.
"""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousError

from dtpo.core.errors import LaunchError, first_line
from dtpo.core.record import new_run_id
from dtpo.dist.process_group import BACKENDS

DEFAULT_RDZV_TIMEOUT_S = 300.0


class _OneLineParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so the CLI can print one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise LaunchError(message)


def build_parser() -> argparse.ArgumentParser:
    """torchrun's argument parser, with dtpo's own flags added in a group of their own."""
    torch_parser = torchrun.get_args_parser()
    parser = _OneLineParser(
        prog="dtpo launch",
        description="Run a training script on many processes and machines through torch.distributed.run. "
        "Every torchrun flag works unchanged; dtpo's own flags are listed under 'dtpo'.",
        parents=[torch_parser],
        add_help=False,  # the parent already has -h/--help
        allow_abbrev=False,
    )
    group = parser.add_argument_group("dtpo")
    group.add_argument("--run-dir", default=None,
                       help="Directory for the run's record (default: runs/<run-id>).")
    group.add_argument("--backend", choices=BACKENDS, default=None,
                       help="Collective backend (default: nccl where CUDA is present, else gloo).")
    group.add_argument("--rdzv-timeout", type=float, default=DEFAULT_RDZV_TIMEOUT_S,
                       help="Seconds to wait for all nodes to join before giving up "
                       f"(default: {DEFAULT_RDZV_TIMEOUT_S:g}).")
    return parser


def parse_launch_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``dtpo launch`` arguments, raising :class:`LaunchError` on malformed ones."""
    args = build_parser().parse_args(argv)
    _validate(args)
    return args


@dataclass(frozen=True)
class LaunchOutcome:
    """How a launch ended.

    Attributes:
        run_dir: The run's directory (its record lives there on the node of rank 0).
        failed: True when a worker failed.
        message: One line describing the failure.
    """

    run_dir: Path
    failed: bool
    message: str | None = None


def launch(args: argparse.Namespace) -> LaunchOutcome:
    """Start the workers of this node and wait for them.

    Args:
        args: Parsed by :func:`parse_launch_args`.

    Returns:
        The outcome. Rendezvous failures raise :class:`LaunchError` instead.
    """
    run_id = args.rdzv_id if args.rdzv_id not in (None, "", "none") else new_run_id()
    run_dir = Path(args.run_dir or Path("runs") / run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ["DTPO_RUN_DIR"] = str(run_dir)
    os.environ["DTPO_RUN_ID"] = run_dir.name
    os.environ["DTPO_LAUNCHED"] = "1"
    if args.backend:
        os.environ["DTPO_BACKEND"] = args.backend
    _apply_rdzv_timeout(args)
    endpoint = torchrun.get_rdzv_endpoint(args) if not args.standalone else "localhost:0"
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        return LaunchOutcome(run_dir, True, _describe_failures(exc))
    except (RendezvousError, TimeoutError, ConnectionError) as exc:
        raise LaunchError(f"rendezvous at {endpoint} did not complete within {args.rdzv_timeout:g} s "
                          f"({_first_line(exc)}): are all {args.nnodes} nodes started and able to reach it?") from None
    except RuntimeError as exc:
        # DistNetworkError and DistStoreError (the store could not be reached) are RuntimeErrors.
        if type(exc).__name__.startswith("Dist"):
            raise LaunchError(f"could not reach the rendezvous endpoint {endpoint} within "
                              f"{args.rdzv_timeout:g} s: {_first_line(exc)}") from None
        raise
    return LaunchOutcome(run_dir, False)


def _validate(args: argparse.Namespace) -> None:
    """Check what can be checked before any process starts."""
    try:
        _, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
    except (RuntimeError, ValueError):
        raise LaunchError(f"--nnodes must be N or MIN:MAX, got {args.nnodes!r}") from None
    nproc = str(args.nproc_per_node)
    if nproc not in ("auto", "cpu", "gpu", "xpu") and not (nproc.isdigit() and int(nproc) > 0):
        raise LaunchError(f"--nproc-per-node must be a positive integer or auto|cpu|gpu, got {nproc!r}")
    if args.rdzv_timeout <= 0:
        raise LaunchError(f"--rdzv-timeout must be positive, got {args.rdzv_timeout:g}")
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if not args.module and not args.no_python:
        script = Path(args.training_script)
        if not script.is_file():
            raise LaunchError(f"training script {args.training_script!r} does not exist")
    if not args.standalone and max_nodes > 1:
        endpoint = torchrun.get_rdzv_endpoint(args) or ""
        host = endpoint.rsplit(":", 1)[0].strip("[]") if endpoint else ""
        if host:
            try:
                socket.getaddrinfo(host, None)
            except OSError:
                raise LaunchError(f"cannot resolve the rendezvous host {host!r} in {endpoint!r}") from None


def _apply_rdzv_timeout(args: argparse.Namespace) -> None:
    """Translate ``--rdzv-timeout`` into each rendezvous backend's own settings, unless given already."""
    conf = dict(item.split("=", 1) for item in args.rdzv_conf.split(",") if "=" in item)
    seconds = str(max(1, round(args.rdzv_timeout)))
    keys = ("timeout",) if args.rdzv_backend == "static" and not args.standalone else (
        "join_timeout", "read_timeout")
    for key in keys:
        conf.setdefault(key, seconds)
    args.rdzv_conf = ",".join(f"{k}={v}" for k, v in conf.items())


def _describe_failures(exc: ChildFailedError) -> str:
    """One line naming the failed ranks and their exit codes."""
    parts = []
    for rank, failure in sorted(exc.failures.items()):
        parts.append(f"rank {rank} exited with code {failure.exitcode}")
    return "worker failed: " + "; ".join(parts) if parts else f"workers failed: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    return first_line(str(exc)) or type(exc).__name__
