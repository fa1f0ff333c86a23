"""``dtpo launch``'s command line: torchrun's own argument parser with dtpo's flags beside it, and every check
that can be made before a process starts (each problem one line naming its flag, a :class:`LaunchError`)."""

from __future__ import annotations

import argparse
import importlib.machinery
import math
import os
import re
import shutil
import socket
import sys
from pathlib import Path

from torch.distributed import run as torchrun
from torch.distributed.elastic.rendezvous.api import rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from dtpo.core.config import BACKENDS, JOB_KNOBS, KNOB_MODES, STALL_FACTOR, STALL_FLOOR_S, TUNE_KNOBS
from dtpo.core.errors import ConfigError, LaunchError
from dtpo.core.frameworks import FRAMEWORKS, computes_on, require
from dtpo.distributed.stall import check_stall_flags

DEFAULT_RDZV_TIMEOUT_S = 300.0
MAX_RDZV_TIMEOUT_S = 30 * 24 * 3600.0
# rdzv-conf keys torch reads as integers (seconds or counts), and as booleans.
_INT_CONF = re.compile(r"(.*_)?timeout|keep_alive_interval|keep_alive_max_attempt")
_BOOL_CONF = ("is_host",)
_BOOL_WORDS = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")


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
                       help="Directory for the run's record (default: runs/<run-id>; with several nodes and no "
                       "--rdzv-id the workers agree on the id).")
    group.add_argument("--overwrite", action="store_true",
                       help="Reuse a --run-dir that already holds a record (the earlier record is replaced).")
    group.add_argument("--backend", choices=BACKENDS, default=None,
                       help="Collective backend (default: nccl where CUDA is present, else gloo).")
    group.add_argument("--rdzv-timeout", type=float, default=DEFAULT_RDZV_TIMEOUT_S,
                       help="Seconds to wait for all nodes to join before giving up "
                       f"(default: {DEFAULT_RDZV_TIMEOUT_S:g}).")
    group.add_argument("--stall-factor", type=float, default=STALL_FACTOR, metavar="N",
                       help="Name and stop a rank that makes no progress for N median step times (and at least "
                       "--stall-floor seconds) instead of letting the others wait for the collective's timeout; "
                       f"with --max-restarts the group restarts (default: {STALL_FACTOR:g}; 0: off).")
    group.add_argument("--stall-floor", type=float, default=STALL_FLOOR_S, metavar="SECONDS",
                       help="Never count a rank as stalled before this many seconds without progress (default: "
                       f"{STALL_FLOOR_S:g}; raise it when checkpoints or evaluations between steps take "
                       "longer).")
    group.add_argument("--no-agent", action="store_true",
                       help="Do not measure the script's steps with dtpo's in-process agent (on by default: it "
                       "counts optimizer steps, batches and DDP communication of an unmodified PyTorch script).")
    group.add_argument("--framework", default="torch", metavar="NAME",
                       help=f"What the script computes with: {', '.join(FRAMEWORKS)} (default: torch). Each worker "
                       "gets what its framework needs to meet the others (JAX: the coordinator address, process count "
                       "and id, CPU collectives; TensorFlow: its TF_CONFIG; Keras: as its KERAS_BACKEND).")
    group.add_argument("--coordinator-port", type=int, default=None, metavar="PORT",
                       help="JAX's coordinator port on rank 0's node; TensorFlow's workers listen on PORT + local "
                       "rank (default: free ports the workers choose).")
    group.add_argument("--tune", default=None, metavar="KNOB",
                       help="Tune while the script trains, through the agent: power-limit, sm-clock, both (toward "
                       "--cost) or stragglers (DDP ranks that only wait lock their SM clock lower).")
    group.add_argument("--cost", default=None, metavar="METRIC",
                       help="The cost the tuner minimises (default: zeus:0.5; see `dtpo train --help`).")
    group.add_argument("--knob-mode", choices=KNOB_MODES, default=None,
                       help="apply (change the GPUs), dry-run (log the changes) or observe (read only).")
    group.add_argument("--metrics-addr", default=None, metavar="[HOST:]PORT",
                       help="Serve live Prometheus metrics of the agent's measurements at this address.")
    return parser


def parse_launch_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``dtpo launch`` arguments, raising :class:`LaunchError` on malformed ones."""
    args = build_parser().parse_args(argv)
    _validate(args)
    return args


def _validate(args: argparse.Namespace) -> None:
    """Check what can be checked before any process starts; each problem is one line naming its flag."""
    try:
        min_nodes, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
    except (RuntimeError, ValueError):
        min_nodes = max_nodes = 0
    if not 0 < min_nodes <= max_nodes:
        raise LaunchError(f"--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got {args.nnodes!r}")
    nproc = str(args.nproc_per_node)
    if nproc not in ("auto", "cpu", "gpu", "xpu") and not (nproc.isdigit() and int(nproc) > 0):
        raise LaunchError(f"--nproc-per-node must be a positive integer or auto|cpu|gpu, got {nproc!r}")
    if not (math.isfinite(args.rdzv_timeout) and 0 < args.rdzv_timeout <= MAX_RDZV_TIMEOUT_S):
        raise LaunchError(f"--rdzv-timeout must be a positive number of seconds (at most {MAX_RDZV_TIMEOUT_S:.0f}), "
                          f"got {args.rdzv_timeout:g}")
    if not (math.isfinite(args.monitor_interval) and args.monitor_interval > 0):
        raise LaunchError(f"--monitor-interval must be a positive number of seconds, got {args.monitor_interval:g}")
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.standalone and max_nodes > 1:
        raise LaunchError(f"--standalone runs on one node, but --nnodes is {args.nnodes!r}: drop one of them")
    backends = set(getattr(rendezvous_handler_registry, "_registry", {})) or {"static", "c10d", "etcd", "etcd-v2"}
    if not args.standalone and args.rdzv_backend not in backends:
        raise LaunchError(f"--rdzv-backend must be one of {', '.join(sorted(backends))}, got {args.rdzv_backend!r}")
    if args.master_port is not None and not 0 < args.master_port < 2**16:
        raise LaunchError(f"--master-port must be a port number in 1-65535, got {args.master_port}")
    if args.node_rank < 0 or (args.rdzv_backend == "static" and not args.standalone and args.node_rank >= max_nodes):
        raise LaunchError(f"--node-rank must be in 0..{max_nodes - 1} with --nnodes {args.nnodes}, "
                          f"got {args.node_rank}")
    _validate_rdzv_conf(args.rdzv_conf)
    check_stall_flags(args.stall_factor, args.stall_floor)
    if args.run_dir is not None and not str(args.run_dir).strip():
        raise LaunchError("--run-dir must name a directory, got an empty string")
    _validate_entrypoint(args)
    _validate_framework(args)
    _validate_tuning(args)
    if not args.standalone:
        _validate_endpoint(args, max_nodes)


def _validate_tuning(args: argparse.Namespace) -> None:
    """``--tune`` names what the agent can tune; it and ``--metrics-addr`` need the agent."""
    if args.metrics_addr is not None and args.no_agent:
        raise LaunchError("--metrics-addr needs the agent: drop --no-agent (or use dtpo.Session in the script)")
    knob = args.tune
    if knob is None:
        if args.cost is not None or args.knob_mode is not None:
            raise LaunchError("--cost and --knob-mode go with --tune")
        return
    if args.no_agent:
        raise LaunchError("--tune needs the agent: drop --no-agent (or use dtpo.Session in the script)")
    parts = {part.strip() for part in knob.split(",")}
    if parts & set(JOB_KNOBS):
        raise LaunchError(f"--tune {knob}: the job knobs ({', '.join(JOB_KNOBS)}) change the script's numerics, "
                          "so only a script written with dtpo.Session can tune them; an unmodified script tunes "
                          f"{', '.join(TUNE_KNOBS)} or stragglers")
    if "rebalance" in parts:
        raise LaunchError(f"--tune {knob}: rebalancing cuts each step's global batch into per-rank shares, which an "
                          "unmodified script's loader cannot do; use dtpo train, or dtpo.Session handing "
                          "session.batches() the global batch (an unmodified script tunes stragglers)")
    if knob not in (*TUNE_KNOBS, "stragglers"):
        raise LaunchError(f"--tune must be one of {', '.join((*TUNE_KNOBS, 'stragglers'))}, got {knob!r}")


def _validate_framework(args: argparse.Namespace) -> None:
    """``--framework`` is known and installed; a ``TF_CONFIG`` of the user's is not silently replaced; a chosen
    ``--coordinator-port`` is free here."""
    try:
        require(args.framework)
    except ConfigError as exc:
        raise LaunchError(str(exc)) from None
    runs_on = computes_on(args.framework)
    if runs_on == "tensorflow" and os.environ.get("TF_CONFIG", "").strip():
        raise LaunchError("TF_CONFIG is already set, but dtpo launch writes each worker's own TF_CONFIG for "
                          "MultiWorkerMirroredStrategy (cluster and task index): unset it, or start the workers "
                          "yourself with --no-agent under plain torchrun")
    port = args.coordinator_port
    if port is None:
        return
    if runs_on not in ("jax", "tensorflow"):
        raise LaunchError(f"--coordinator-port is for --framework jax or tensorflow (this script computes on "
                          f"{runs_on})")
    if not 0 < port < 2**16:
        raise LaunchError(f"--coordinator-port must be a port number in 1-65535, got {port}")
    if runs_on == "jax":
        ports = [port] if args.node_rank == 0 else []  # JAX's coordinator runs beside rank 0
    else:
        nproc = int(args.nproc_per_node) if str(args.nproc_per_node).isdigit() else 1
        ports = list(range(port, port + nproc))
    if ports and ports[-1] >= 2**16:
        raise LaunchError(f"--coordinator-port {port}: the workers' ports {port}-{ports[-1]} pass 65535")
    for each in ports:
        if not port_free(each):
            raise LaunchError(f"--coordinator-port: port {each} is in use on this machine; choose another, or "
                              "leave the flag out and let the workers take free ports")


def port_free(port: int) -> bool:
    """Whether a TCP server can listen on ``port`` on every interface of this machine now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def _validate_rdzv_conf(text: str) -> None:
    """``--rdzv-conf key=value,...``: well formed, with integers and booleans where torch expects them."""
    if not text.strip():
        return
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not key or not sep or not value:
            raise LaunchError(f"--rdzv-conf must be KEY=VALUE[,KEY=VALUE...], got {text!r}")
        if _INT_CONF.fullmatch(key) and not (value.isdigit() and int(value) > 0):
            raise LaunchError(f"--rdzv-conf {key} must be a positive integer, got {value!r}")
        if key in _BOOL_CONF and value.lower() not in _BOOL_WORDS:
            raise LaunchError(f"--rdzv-conf {key} must be true or false, got {value!r}")


def _validate_entrypoint(args: argparse.Namespace) -> None:
    """The script exists, or the ``-m`` module can be found where the workers will look for it."""
    if args.no_python:
        if args.module:
            raise LaunchError("--no-python and -m/--module cannot be used together")
        if shutil.which(args.training_script) is None and not Path(args.training_script).is_file():
            raise LaunchError(f"program {args.training_script!r} (--no-python) was not found")
        return
    if args.module:
        top = args.training_script.split(".", 1)[0]
        search = [os.getcwd(), *(p for p in sys.path if p)]
        if not top or importlib.machinery.PathFinder.find_spec(top, search) is None and top not in sys.modules:
            raise LaunchError(f"module {args.training_script!r} (-m) was not found: no module named {top!r}")
        return
    if not Path(args.training_script).is_file():
        raise LaunchError(f"training script {args.training_script!r} does not exist")


def _validate_endpoint(args: argparse.Namespace, max_nodes: int) -> None:
    """The rendezvous endpoint parses as HOST:PORT and, with several nodes, its host resolves."""
    if args.rdzv_endpoint:
        flag, endpoint = "--rdzv-endpoint", args.rdzv_endpoint
    elif args.rdzv_backend == "static":
        flag, endpoint = "--master-addr/--master-port", f"{args.master_addr}:{args.master_port or 29500}"
    else:
        if max_nodes > 1:
            raise LaunchError(f"--rdzv-endpoint HOST:PORT is needed with --rdzv-backend {args.rdzv_backend}")
        return
    try:
        host, _ = parse_rendezvous_endpoint(endpoint, default_port=29400)
    except ValueError:
        raise LaunchError(f"{flag} must be HOST:PORT with a port in 0-65535, got {endpoint!r}") from None
    if max_nodes > 1:
        try:
            socket.getaddrinfo(host, None)
        except OSError:
            raise LaunchError(f"cannot resolve the rendezvous host {host!r} in {endpoint!r}") from None


def apply_rdzv_timeout(args: argparse.Namespace) -> None:
    """Translate ``--rdzv-timeout`` into each rendezvous backend's own settings, unless given already."""
    conf = dict(item.split("=", 1) for item in args.rdzv_conf.split(",") if "=" in item)
    seconds = str(max(1, round(args.rdzv_timeout)))
    keys = ("timeout",) if args.rdzv_backend == "static" and not args.standalone else (
        "join_timeout", "read_timeout")
    for key in keys:
        conf.setdefault(key, seconds)
    args.rdzv_conf = ",".join(f"{k}={v}" for k, v in conf.items())
