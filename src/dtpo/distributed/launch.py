"""``dtpo launch``: torchrun's elastic launcher with dtpo's flags beside its own.

The parsing and launching are ``torch.distributed.run``'s own (``get_args_parser`` and ``run``), so every
torchrun flag works unchanged. dtpo adds a run directory, a backend override and one rendezvous timeout,
checks every value it can before any process starts, keeps the elastic agent's log (and the C++ frames c10d
prints while rendezvousing) in ``RUN_DIR/launcher.log`` instead of the user's terminal, and turns the
launcher's failures and interrupts into a :class:`LaunchOutcome` or a one-line :class:`LaunchError`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import logging
import math
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.api import RendezvousError, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from dtpo.core.config import BACKENDS, JOB_KNOBS, KNOB_MODES, TUNE_KNOBS
from dtpo.core.errors import LaunchError, first_line, signal_name
from dtpo.core.files import is_writable_dir
from dtpo.core.launch_contract import LaunchContract
from dtpo.distributed.run_dir import LAUNCHER_LOG, is_empty_run, prepare_run_dir, remove_empty_run

log = logging.getLogger(__name__)

DEFAULT_RDZV_TIMEOUT_S = 300.0
MAX_RDZV_TIMEOUT_S = 30 * 24 * 3600.0
DEFAULT_RUN_ROOT = Path("runs")
# torchelastic's agent shares its rendezvous TCPStore with the workers, and that store outlives a restart: the
# workers of the next attempt read the previous attempt's keys under the same "default_pg" prefix (gloo's peer
# addresses, NCCL's unique id) and connect to ports of dead processes ("Gloo connectFullMesh failed ...
# Connection refused"; pytorch/pytorch#135712). With sharing off, every attempt's rank 0 hosts a fresh store on a
# new MASTER_PORT.
SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# rdzv-conf keys torch reads as integers (seconds or counts), and as booleans.
_INT_CONF = re.compile(r"(.*_)?timeout|keep_alive_interval|keep_alive_max_attempt")
_BOOL_CONF = ("is_host",)
_BOOL_WORDS = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_KILLED_BY_US = (-signal.SIGTERM, 128 + signal.SIGTERM)  # survivors torchrun stopped after a failure


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
    group.add_argument("--no-agent", action="store_true",
                       help="Do not measure the script's steps with dtpo's in-process agent (on by default: it "
                       "counts optimizer steps, batches and DDP communication of an unmodified PyTorch script).")
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


@dataclass(frozen=True)
class LaunchOutcome:
    """How a launch ended.

    Attributes:
        run_dir: The run's directory on this node (its record lives there on the node of rank 0); ``None``
            when the workers were to choose it and none of them did (nothing was recorded).
        failed: True when a worker failed or the launch was interrupted.
        message: One line describing the failure or interrupt.
        signal: The signal that interrupted the launcher (``SIGINT``, ``SIGTERM``, ...), else ``None``.
        restarts: How many times torchrun restarted the workers (``--max-restarts``).
        attempt_errors: The first real error of each attempt that failed, oldest first (a run restarted
            twice and then successful has two).
        recorded: False when the run directory held nothing once the workers ended (a script without
            ``dtpo.Session``, or workers that failed before measuring); the empty directory is removed.
        launcher: What started and restarted the workers: ``"torchrun"``, or ``"Ray Train"`` (``--engine ray``).
    """

    run_dir: Path | None
    failed: bool
    message: str | None = None
    signal: int | None = None
    restarts: int = 0
    attempt_errors: tuple[str, ...] = ()
    recorded: bool = True
    launcher: str = "torchrun"

    @property
    def interrupted(self) -> bool:
        """Whether a signal (Ctrl-C, SIGTERM) ended the run."""
        return self.signal is not None


def launch(args: argparse.Namespace, config: Path | None = None, agent_path: Path | None = None) -> LaunchOutcome:
    """Start the workers of this node and wait for them.

    Args:
        args: Parsed by :func:`parse_launch_args`.
        config: The run's configuration file the workers read (``dtpo train``, the agent); ``None`` passes on the
            one the environment names, if any.
        agent_path: The folder of the agent's ``sitecustomize``, put first on the workers' ``PYTHONPATH`` and
            woken by the contract's ``agent`` flag; ``None`` (or ``--no-agent``): no agent.

    Returns:
        The outcome, also for failed and interrupted runs. Rendezvous failures and a bad ``--run-dir``
        raise :class:`LaunchError` / :class:`~dtpo.core.errors.ConfigError` instead.
    """
    inherited = LaunchContract.from_environ()
    agree = _workers_choose_run_dir(args)
    scratch: Path | None = None
    existed = False
    root_existed = DEFAULT_RUN_ROOT.exists()
    if agree:
        root = _prepare_root(DEFAULT_RUN_ROOT)
        scratch = Path(tempfile.mkdtemp(prefix="dtpo-launch-"))
        pointer = scratch / "run-dir"
        where = {"run_root": root, "run_pointer": pointer}
        log_path = scratch / LAUNCHER_LOG
        before = _subdirs(root)
        run_dir: Path | None = None
    else:
        named = args.run_dir if args.run_dir is not None else _shared_run_dir(args)
        existed = named is not None and Path(named).expanduser().exists()
        run_dir = prepare_run_dir(named, overwrite=args.overwrite, default_root=DEFAULT_RUN_ROOT)
        where = {"run_dir": run_dir}
        log_path = run_dir / LAUNCHER_LOG
    agent = agent_path is not None and not args.no_agent
    contract = LaunchContract(config=config or inherited.config, launched=True,
                              backend=args.backend or inherited.backend, agent=agent, **where)
    env = contract.to_environ()
    if agent:
        assert agent_path is not None
        env["PYTHONPATH"] = os.pathsep.join([str(agent_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    if _restarts_possible(args) and SHARED_STORE_ENV not in os.environ:
        env[SHARED_STORE_ENV] = "1"
    _apply_rdzv_timeout(args)
    endpoint = torchrun.get_rdzv_endpoint(args) if not args.standalone else "localhost:0"
    watcher = _AgentWatcher()
    failed, message, signum = False, None, None
    try:
        with worker_environment(env), _agent_logs(log_path, watcher), _signals_raise():
            torchrun.run(args)
    except ChildFailedError as exc:
        failed, message = True, _describe_failures(exc)
    except SignalException as exc:
        signum = int(exc.sigval)
    except KeyboardInterrupt:
        signum = int(signal.SIGINT)
    except (RendezvousError, TimeoutError, ConnectionError) as exc:
        where = _after_failed_rendezvous(log_path, run_dir, existed)
        raise LaunchError(f"rendezvous at {endpoint} did not complete within {args.rdzv_timeout:g} s "
                          f"({_first_line(exc)}): are all {args.nnodes} nodes started and able to reach it?"
                          f"{where}") from None
    except RuntimeError as exc:
        # DistNetworkError and DistStoreError (the store could not be reached) are RuntimeErrors.
        if type(exc).__name__.startswith("Dist"):
            where = _after_failed_rendezvous(log_path, run_dir, existed)
            raise LaunchError(f"could not reach the rendezvous endpoint {endpoint} within "
                              f"{args.rdzv_timeout:g} s: {_first_line(exc)}{where}") from None
        raise
    if signum is not None:
        failed, message = True, f"interrupted by {signal_name(signum)}"
    if agree:
        assert scratch is not None
        run_dir = _agreed_run_dir(pointer, root, before)
        _move_log(log_path, run_dir)
        shutil.rmtree(scratch, ignore_errors=True)
    _drop_empty_log(run_dir)
    recorded = run_dir is not None and not is_empty_run(run_dir)
    if run_dir is not None and not recorded and not existed:
        remove_empty_run(run_dir)
    if not root_existed:  # the default root this launch created, if nothing stayed in it
        with contextlib.suppress(OSError):
            DEFAULT_RUN_ROOT.rmdir()
    return LaunchOutcome(run_dir, failed, message, signum, watcher.restarts, tuple(watcher.attempt_errors),
                         recorded)


def _restarts_possible(args: argparse.Namespace) -> bool:
    """Whether the workers may be started more than once (``--max-restarts``, or an elastic node count)."""
    try:
        min_nodes, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
    except (RuntimeError, ValueError):
        min_nodes = max_nodes = 1
    return args.max_restarts > 0 or min_nodes != max_nodes


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
    if args.run_dir is not None and not str(args.run_dir).strip():
        raise LaunchError("--run-dir must name a directory, got an empty string")
    _validate_entrypoint(args)
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
    if knob not in (*TUNE_KNOBS, "stragglers"):
        raise LaunchError(f"--tune must be one of {', '.join((*TUNE_KNOBS, 'stragglers'))}, got {knob!r}")


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


def _apply_rdzv_timeout(args: argparse.Namespace) -> None:
    """Translate ``--rdzv-timeout`` into each rendezvous backend's own settings, unless given already."""
    conf = dict(item.split("=", 1) for item in args.rdzv_conf.split(",") if "=" in item)
    seconds = str(max(1, round(args.rdzv_timeout)))
    keys = ("timeout",) if args.rdzv_backend == "static" and not args.standalone else (
        "join_timeout", "read_timeout")
    for key in keys:
        conf.setdefault(key, seconds)
    args.rdzv_conf = ",".join(f"{k}={v}" for k, v in conf.items())


# --- where the run directory comes from ---------------------------------------------------------------------


def _workers_choose_run_dir(args: argparse.Namespace) -> bool:
    """Several nodes, no ``--run-dir`` and no shared ``--rdzv-id``: the launchers cannot agree on a name by
    themselves, so the workers do (rank 0 picks one and broadcasts it; see the Session)."""
    if args.run_dir is not None or args.standalone or _shared_run_dir(args) is not None:
        return False
    return torchrun.parse_min_max_nnodes(args.nnodes)[1] > 1


def _shared_run_dir(args: argparse.Namespace) -> Path | None:
    """``runs/<rdzv-id>`` when the user gave a rendezvous id every node shares (and it is a safe name)."""
    rdzv_id = str(args.rdzv_id or "")
    if args.standalone or rdzv_id in ("", "none") or not _SAFE_ID.match(rdzv_id):
        return None
    return DEFAULT_RUN_ROOT / rdzv_id


def _prepare_root(root: Path) -> Path:
    """The parent the workers create the run directory in: exists and is writable."""
    path = root.absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot create {path} for the run directory ({exc.strerror or exc}); "
                          "pass --run-dir") from None
    if not is_writable_dir(path):
        raise LaunchError(f"{path} is not writable; pass --run-dir")
    return path.resolve()


def _subdirs(root: Path) -> set[str]:
    try:
        return {p.name for p in root.iterdir() if p.is_dir()}
    except OSError:
        return set()


def _agreed_run_dir(pointer: Path, root: Path, before: set[str]) -> Path | None:
    """The directory the workers of this node agreed on: the path they wrote to the contract's ``run_pointer``, else
    the one new directory under the root (``None`` when there is no single one: nothing was recorded)."""
    with contextlib.suppress(OSError):
        text = pointer.read_text().strip()
        if text and Path(text).is_dir():
            return Path(text)
    new = _subdirs(root) - before
    if len(new) == 1:
        return root / new.pop()
    if len(new) > 1:
        log.warning("cannot tell which of %s holds this run (another run started beside it)",
                    ", ".join(sorted(new)))
    return None


def _move_log(log_path: Path, run_dir: Path | None) -> None:
    if run_dir is None or not log_path.exists():
        return
    with contextlib.suppress(OSError):
        shutil.move(str(log_path), str(run_dir / LAUNCHER_LOG))


def _drop_empty_log(run_dir: Path | None) -> None:
    if run_dir is None:
        return
    path = run_dir / LAUNCHER_LOG
    with contextlib.suppress(OSError):
        if path.is_file() and path.stat().st_size == 0:
            path.unlink()


def _after_failed_rendezvous(log_path: Path, run_dir: Path | None, existed: bool) -> str:
    """Nothing ran: remove the run directory this launch created, unless the launcher's log (in it, or in the
    temporary folder) says something. Returns where that log is, for the error message."""
    _drop_empty_log(log_path.parent)
    if not log_path.exists():
        if run_dir is not None and not existed:
            remove_empty_run(run_dir)
        elif run_dir is None:
            shutil.rmtree(log_path.parent, ignore_errors=True)
        return ""
    return f" (the launcher's log: {log_path})"


# --- the agent's process: environment, logs, signals ---------------------------------------------------------


@contextlib.contextmanager
def worker_environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for ``None``, unset) environment variables for the workers, and put them back afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        _set_environment(values)
        yield
    finally:
        _set_environment(saved)


def _set_environment(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class _AgentWatcher(logging.Handler):
    """Reads the elastic agent's own log records: how many restarts, and each failed attempt's first error."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.restarts = 0
        self.attempt_errors: list[str] = []
        self._last_failure: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = str(record.msg)
        args = record.args if isinstance(record.args, tuple) else ()
        if message.startswith("failed (exitcode") and len(args) >= 2:
            self._last_failure = f"local rank {args[1]} exited with code {args[0]}"
        elif "will restart worker group" in message and "attempts left" in message:
            self.restarts += 1
            self.attempt_errors.append(self._last_failure or "workers failed")
            self._last_failure = None


_AGENT_LOGGER = "torch.distributed"
_WATCHED = ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api")


@contextlib.contextmanager
def _agent_logs(path: Path, watcher: _AgentWatcher) -> Iterator[None]:
    """Send the elastic agent's log to ``path`` instead of stderr, and its C++ noise there while it rendezvouses.

    torchrun logs through the ``torch.distributed`` loggers (whose handler writes to stderr); c10d's C++ code
    writes warnings with full stack frames straight to file descriptor 2 while it connects to the store.
    The loggers get a file handler for the launch; file descriptor 2 points at the same file only while the
    rendezvous handler is created and while it rendezvouses, so the workers (started afterwards) keep the
    user's terminal.
    """
    parent = logging.getLogger(_AGENT_LOGGER)
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved_handlers, saved_propagate = parent.handlers[:], parent.propagate
    watched = [logging.getLogger(name) for name in _WATCHED]
    saved_levels = [logger.level for logger in watched]
    original_get = rdzv_registry.get_rendezvous_handler

    def quiet_get(params: Any) -> Any:
        with _stderr_to(path):
            rdzv = original_get(params)
        inner = rdzv.next_rendezvous

        def next_rendezvous(*a: Any, **k: Any) -> Any:
            with _stderr_to(path):
                return inner(*a, **k)

        with contextlib.suppress(AttributeError, TypeError):
            rdzv.next_rendezvous = next_rendezvous
        return rdzv

    parent.handlers = [handler]
    parent.propagate = False
    for logger in watched:
        logger.setLevel(logging.INFO)
        logger.addHandler(watcher)
    rdzv_registry.get_rendezvous_handler = quiet_get
    try:
        yield
    finally:
        rdzv_registry.get_rendezvous_handler = original_get
        for logger, level in zip(watched, saved_levels, strict=True):
            logger.removeHandler(watcher)
            logger.setLevel(level)
        parent.handlers, parent.propagate = saved_handlers, saved_propagate
        handler.close()


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 (what C++ code writes to) at ``path`` for a while; a no-op where it cannot."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        os.dup2(target, 2)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def _raise_signal_exception(signum: int, frame: Any) -> None:
    raise SignalException(f"got signal {signum}", sigval=signal.Signals(signum))


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise torchrun's ``SignalException`` from the start (torchrun installs the same once
    the workers run); the launcher's handlers come back afterwards, so a later Ctrl-C is not torchrun's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, _raise_signal_exception)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# --- describing what happened --------------------------------------------------------------------------------


def _describe_failures(exc: ChildFailedError) -> str:
    """One line naming the first real failure: not the SIGTERM torchrun sent the surviving ranks."""
    failures = list(exc.failures.items())
    if not failures:
        return f"the workers failed: {_first_line(exc)}"
    real = [(rank, f) for rank, f in failures if f.exitcode not in _KILLED_BY_US] or failures
    rank, first = min(real, key=lambda item: item[1].timestamp)  # ties keep torchrun's order (first seen first)
    text = f"rank {rank} {_exit_words(first.exitcode)}"
    reported = _reported_error(first.message) if first.error_file_data else ""
    if reported:
        text += f": {reported}"
    others = len(failures) - 1
    if others:
        text += f" (then {others} other rank{'s' if others > 1 else ''} stopped)"
    return text


def _reported_error(message: Any) -> str:
    """The first line of the error a worker wrote to its torchelastic error file (``@record``), if any."""
    if isinstance(message, dict):
        message = message.get("message", "")
    text = first_line(str(message or ""))
    return "" if text.startswith(("To enable traceback", "Signal ")) else text


def _exit_words(code: int) -> str:
    if code < 0:
        return f"was killed by {signal_name(-code)}"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"exited with code {code} ({signal_name(code - 128)})"
    return f"exited with code {code}"


def _first_line(exc: BaseException) -> str:
    return first_line(str(exc)) or type(exc).__name__
