"""``dtpo launch``: torchrun's elastic launcher with dtpo's flags beside its own.

The parsing and launching are ``torch.distributed.run``'s own (``get_args_parser`` and ``run``), so every
torchrun flag works unchanged. dtpo adds a run directory, a backend override, one rendezvous timeout and its
agent's flags, and checks every value it can before any process starts (:mod:`~dtpo.distributed.launch_args`).
This module keeps the elastic agent's log (and the C++ frames c10d prints while rendezvousing) in
``RUN_DIR/launcher.log`` instead of the user's terminal, and turns the launcher's failures and interrupts into a
:class:`LaunchOutcome` or a one-line :class:`LaunchError`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import signal
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
from torch.distributed.elastic.rendezvous.api import RendezvousError
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from dtpo.core.errors import LaunchError, first_line, signal_name
from dtpo.core.files import default_run_root, is_writable_dir
from dtpo.core.launch_contract import LaunchContract
from dtpo.distributed.launch_args import apply_rdzv_timeout
from dtpo.distributed.node_beats import NodeBeats
from dtpo.distributed.oom import MemoryWatch, out_of_memory_words
from dtpo.distributed.run_dir import LAUNCHER_LOG, is_empty_run, prepare_run_dir, remove_empty_run
from dtpo.distributed.stall import Stall, StallPolicy, StallWatch

log = logging.getLogger(__name__)

# torchelastic's agent shares its rendezvous TCPStore with the workers, and that store outlives a restart: the
# workers of the next attempt read the previous attempt's keys under the same "default_pg" prefix (gloo's peer
# addresses, NCCL's unique id) and connect to ports of dead processes ("Gloo connectFullMesh failed ...
# Connection refused"; pytorch/pytorch#135712). With sharing off, every attempt's rank 0 hosts a fresh store on a
# new MASTER_PORT.
SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_KILLED_BY_US = (-signal.SIGTERM, 128 + signal.SIGTERM)  # survivors torchrun stopped after a failure


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
        stalls: The ranks of this node the launcher stopped for making no progress, at most one per attempt
            (:attr:`stall`: the last attempt's).
    """

    run_dir: Path | None
    failed: bool
    message: str | None = None
    signal: int | None = None
    restarts: int = 0
    attempt_errors: tuple[str, ...] = ()
    recorded: bool = True
    launcher: str = "torchrun"
    stalls: tuple[Stall, ...] = ()

    @property
    def stall(self) -> Stall | None:
        """Why the run ended, where a rank of this node made no progress and was stopped (``message`` says it)."""
        if not self.failed or self.interrupted:
            return None
        return next((stall for stall in self.stalls if stall.attempt == self.restarts), None)

    def stall_of(self, attempt: int) -> Stall | None:
        """The stall that ended ``attempt``, if one did."""
        return next((stall for stall in self.stalls if stall.attempt == attempt), None)

    @property
    def interrupted(self) -> bool:
        """Whether a signal (Ctrl-C, SIGTERM) ended the run."""
        return self.signal is not None


def launch(args: argparse.Namespace, config: Path | None = None, agent_path: Path | None = None) -> LaunchOutcome:
    """Start the workers of this node and wait for them.

    Args:
        args: Parsed by :func:`~dtpo.distributed.launch_args.parse_launch_args`.
        config: The run's configuration file the workers read (``dtpo train``, the agent); ``None`` passes on the
            one the environment names, if any.
        agent_path: The folder of the agent's ``sitecustomize``, put first on the workers' ``PYTHONPATH`` and
            woken by the contract's ``agent`` flag (or its ``framework``: the workers of a JAX or TensorFlow
            script are prepared there even with ``--no-agent``); ``None``: neither.

    Returns:
        The outcome, also for failed and interrupted runs. Rendezvous failures and a bad ``--run-dir``
        raise :class:`LaunchError` / :class:`~dtpo.core.errors.ConfigError` instead.
    """
    inherited = LaunchContract.from_environ()
    agree = _workers_choose_run_dir(args)
    scratch: Path | None = None
    existed = False
    run_root = default_run_root()
    root_existed = run_root.exists()
    if agree:
        root = _prepare_root(run_root)
        scratch = Path(tempfile.mkdtemp(prefix="dtpo-launch-"))
        pointer = scratch / "run-dir"
        where = {"run_root": root, "run_pointer": pointer}
        log_path = scratch / LAUNCHER_LOG
        before = _subdirs(root)
        run_dir: Path | None = None
    else:
        named = args.run_dir if args.run_dir is not None else _shared_run_dir(args)
        existed = named is not None and Path(named).expanduser().exists()
        run_dir = prepare_run_dir(named, overwrite=args.overwrite, default_root=run_root)
        where = {"run_dir": run_dir}
        log_path = run_dir / LAUNCHER_LOG
    agent = agent_path is not None and not args.no_agent
    heartbeats = Path(tempfile.mkdtemp(prefix="dtpo-heartbeats-"))
    framework = getattr(args, "framework", "torch")
    framework = None if framework == "torch" else framework
    contract = LaunchContract(config=config or inherited.config, launched=True,
                              backend=args.backend or inherited.backend, agent=agent, framework=framework,
                              coordinator_port=getattr(args, "coordinator_port", None), heartbeat_dir=heartbeats,
                              **where)
    env = contract.to_environ()
    if agent_path is not None and (agent or framework is not None):  # the framework's set-up needs it too
        env["PYTHONPATH"] = os.pathsep.join([str(agent_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    if _restarts_possible(args) and SHARED_STORE_ENV not in os.environ:
        env[SHARED_STORE_ENV] = "1"
    apply_rdzv_timeout(args)
    endpoint = torchrun.get_rdzv_endpoint(args) if not args.standalone else "localhost:0"
    watcher = _AgentWatcher()
    stalls = StallWatch(heartbeats, StallPolicy(args.stall_factor, args.stall_floor), nodes=_node_beats(args))
    failed, message, signum = False, None, None
    try:
        with worker_environment(env), _agent_logs(log_path, watcher), _signals_raise(), stalls, MemoryWatch():
            torchrun.run(args)
    except ChildFailedError as exc:
        failed, message = True, _describe_failures(exc)
    except SignalException as exc:
        signum = int(exc.sigval)
    except KeyboardInterrupt:
        signum = int(signal.SIGINT)
    except (RendezvousError, TimeoutError, ConnectionError) as exc:
        if not stalls.saw_workers:
            where = _after_failed_rendezvous(log_path, run_dir, existed)
            raise LaunchError(f"rendezvous at {endpoint} did not complete within {args.rdzv_timeout:g} s "
                              f"({_first_line(exc)}): are all {args.nnodes} nodes started and able to reach it?"
                              f"{where}") from None
        failed, message = True, f"lost the rendezvous store at {endpoint} after the workers started: " + \
            _first_line(exc)
    except RuntimeError as exc:
        # DistNetworkError and DistStoreError (the store could not be reached) are RuntimeErrors.
        if not type(exc).__name__.startswith("Dist"):
            raise
        if not stalls.saw_workers:
            where = _after_failed_rendezvous(log_path, run_dir, existed)
            raise LaunchError(f"could not reach the rendezvous endpoint {endpoint} within "
                              f"{args.rdzv_timeout:g} s: {_first_line(exc)}{where}") from None
        failed, message = True, f"lost the rendezvous store at {endpoint} after the workers started: " + \
            _first_line(exc)
    except OSError as exc:  # socket.gaierror: the rendezvous host's name does not resolve
        where = _after_failed_rendezvous(log_path, run_dir, existed)
        raise LaunchError(f"rendezvous at {endpoint}: {exc.strerror or _first_line(exc)}{where}") from None
    finally:
        shutil.rmtree(heartbeats, ignore_errors=True)
    attempt_errors = [_stall_or(stalls, attempt, error) for attempt, error in enumerate(watcher.attempt_errors)]
    if failed:
        message = _stall_or(stalls, watcher.restarts, message)
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
            run_root.rmdir()
    return LaunchOutcome(run_dir, failed, message, signum, watcher.restarts, tuple(attempt_errors), recorded,
                         stalls=tuple(stalls.stalls))


def _node_beats(args: argparse.Namespace) -> NodeBeats | None:
    """The launchers' beats to each other through the rendezvous store, in a job of several nodes."""
    _, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
    if args.standalone or max_nodes < 2 or args.rdzv_backend not in ("c10d", "static"):  # a TCPStore to share
        return None
    host, port = parse_rendezvous_endpoint(torchrun.get_rdzv_endpoint(args), default_port=29400)
    return NodeBeats(f"{host}:{port}", args.rdzv_id)


def _stall_or(stalls: StallWatch, attempt: int, error: str | None) -> str | None:
    """The stall of ``attempt`` in words, where the watch stopped it; else the error torchrun saw."""
    stall = next((stall for stall in stalls.stalls if stall.attempt == attempt), None)
    return stall.describe() if stall is not None else error


def _restarts_possible(args: argparse.Namespace) -> bool:
    """Whether the workers may be started more than once (``--max-restarts``, or an elastic node count)."""
    try:
        min_nodes, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
    except (RuntimeError, ValueError):
        min_nodes = max_nodes = 1
    return args.max_restarts > 0 or min_nodes != max_nodes


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
    return default_run_root() / rdzv_id


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
    """One line naming the first real failure: not the SIGTERM torchrun sent the surviving ranks; a rank that ran out
    of memory (the OOM killer's SIGKILL, a failed allocation) says so."""
    failures = list(exc.failures.items())
    if not failures:
        return f"the workers failed: {_first_line(exc)}"
    real = [(rank, f) for rank, f in failures if f.exitcode not in _KILLED_BY_US] or failures
    rank, first = min(real, key=lambda item: item[1].timestamp)  # ties keep torchrun's order (first seen first)
    text = f"rank {rank} {_exit_words(first.exitcode)}"
    reported = _reported_error(first.message) if first.error_file_data else ""
    memory = out_of_memory_words(first.pid, first.exitcode, reported)  # the OOM killer's SIGKILL, a failed allocation
    if memory or reported:
        text += f": {memory or reported}"
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
