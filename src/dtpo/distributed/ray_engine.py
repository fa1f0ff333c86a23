"""Ray Train as a second engine: ``dtpo train --engine ray`` starts the workers through Ray Train's TorchTrainer.

Ray Train does the launching: a local Ray instance (``ray.init``, started for the run and shut down after it) or
the cluster at ``--ray-address``; a :class:`~ray.train.torch.TorchTrainer` with one Ray worker per dtpo worker
(:class:`~ray.train.ScalingConfig`); the process group (``TorchConfig``; Ray sets ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and ``NODE_RANK``, so the Session's :func:`~dtpo.distributed.process_group.join`
reuses the group as it finds it); restarts (:class:`~ray.train.FailureConfig`, ``max_failures`` =
``--max-restarts``); checkpoints (dtpo's DCP folders reported as :class:`ray.train.Checkpoint` s, restored through
``ray.train.get_checkpoint()``).

What dtpo adds around it, so a Ray run ends with the same record, summary and report as a torchrun run:

* The driver (the ``dtpo train`` process) plays the launcher's part: the workers get its launch contract (launched, the
  run directory), and :func:`launch_on_ray` returns the :class:`~dtpo.distributed.launch.LaunchOutcome` that
  ``dtpo.cli.conclude.conclude_run`` turns into the record, summary, report and traces.
* Attempts: Ray's context has no restart count, so rank 0 of each attempt counts it in ``RUN_DIR/ray/attempt``
  (attempts follow one another, never overlap) and every rank gets it as ``TORCHELASTIC_RESTART_COUNT``, which
  is what the Session reads: attempt N's partial records go to ``RUN_DIR/ranks/attempt-N/`` as under torchrun.
  Why each attempt failed comes from Ray Train's controller (:class:`AttemptErrors`, a ``UserCallback``).
* Interrupts: Ray Train runs the training function in a thread of each Ray worker, where the Session cannot take
  SIGTERM. The driver catches SIGINT/SIGTERM and writes ``RUN_DIR/ray/stop``; the workers look for it together
  (one all-reduce every :data:`STOP_CHECK_EVERY` steps, so every rank stops at the same step and none is left in a
  collective) and end as ``interrupted`` with their partial records written; the driver then concludes the run.
  A second signal, or workers that do not stop within :data:`STOP_GRACE_S`, end Ray at once.

Hand-written here (Ray has no API for them): the attempt count, the stop file, and the reachability check of
``--ray-address`` (``ray.init`` would wait minutes for an address where nothing listens).

With several nodes, the run directory (and ``--checkpoint-dir``) must be one file system shared by the driver
and all workers, as with torchrun; dtpo must be installed on every node.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dtpo.core.config import RunConfig
from dtpo.core.errors import ConfigError, LaunchError, first_line, signal_name
from dtpo.core.launch_contract import ENVIRON_NAMES, LaunchContract
from dtpo.distributed.launch import LaunchOutcome, _stderr_to, worker_environment
from dtpo.distributed.ray_failures import describe_worker_failures
from dtpo.distributed.run_dir import LAUNCHER_LOG, holds_record

log = logging.getLogger(__name__)

RAY_HINT = "pip install 'dtpo[ray]'"
RAY_DIR = "ray"  # dtpo's own files about the Ray run, in the run directory
ATTEMPT_FILE = "attempt"
STOP_FILE = "stop"
ERRORS_FILE = "attempt-errors.jsonl"
STOP_CHECK_EVERY = 10  # steps between the workers' checks for a stop request (one all-reduce of one number)
STOP_GRACE_S = 60.0  # how long the driver waits for the workers to stop after a signal
CONNECT_TIMEOUT_S = 5.0
DEFAULT_GCS_PORT = 6379
DEFAULT_CLIENT_PORT = 10001
LAUNCHER_NAME = "ray"  # environment["launcher"] of a Ray run's record


# --- checks before anything starts -------------------------------------------------------------------------


def check_ray_installed(connecting: bool = False) -> str:
    """Import Ray Train's torch support; returns Ray's version.

    Args:
        connecting: The run will connect to an existing cluster (``--ray-address``): where an authentication token
            is at hand (``ray start --head`` writes one) and ``RAY_AUTH_MODE`` is unset, token authentication is
            turned on, as Ray's own driver needs to be told before Ray is imported.

    Raises:
        ConfigError: Ray is missing, or cannot be imported here (one line saying what to do).
    """
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"--engine ray needs Ray Train, which is not installed: {RAY_HINT}")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if connecting and "RAY_AUTH_MODE" not in os.environ and _auth_token_available():
        os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"  # the API used here (the default since Ray 2.51)
    try:
        import ray
        import ray.train.torch  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"--engine ray needs Ray Train ({first_line(str(exc))}): {RAY_HINT}") from None
    except Exception as exc:  # noqa: BLE001 - Ray's import probes accelerators and can fail in other ways
        why = f"{type(exc).__name__}: {first_line(str(exc))}"
        if "amd_smi" in str(exc) or "amdsmi" in repr(exc):
            why += (" (the amdsmi package is installed without ROCm's libamd_smi.so; `pip uninstall amdsmi` "
                    "where there is no AMD GPU)")
        raise ConfigError(f"--engine ray: Ray cannot be imported here: {why}") from None
    return str(ray.__version__)


def parse_ray_address(address: str) -> tuple[str, int, bool]:
    """``(host, port, client)`` of a ``--ray-address``: ``HOST[:PORT]`` (the cluster's GCS, port 6379 by
    default) or ``ray://HOST[:PORT]`` (Ray Client, port 10001).

    Raises:
        ConfigError: Not an address of that form.
    """
    text = address.strip()
    client = text.startswith("ray://")
    rest = text.removeprefix("ray://").rstrip("/")
    host, sep, port_text = rest.rpartition(":") if ":" in rest else (rest, "", "")
    host = host.strip("[]")
    port = DEFAULT_CLIENT_PORT if client else DEFAULT_GCS_PORT
    if sep:
        if not port_text.isdigit() or not 0 < int(port_text) < 2**16:
            raise ConfigError(f"--ray-address must be HOST:PORT, ray://HOST:PORT or auto, got {address!r}")
        port = int(port_text)
    if not host or "/" in host:
        raise ConfigError(f"--ray-address must be HOST:PORT, ray://HOST:PORT or auto, got {address!r}")
    return host, port, client


def check_ray_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
    """Check that a Ray cluster answers at ``address`` (a TCP connection within ``timeout_s``); ``auto`` is
    looked up the way ``ray.init`` does (``RAY_ADDRESS``, else the cluster ``ray start`` started on this machine).

    Returns:
        The address to pass to ``ray.init``.

    Raises:
        ConfigError: One line: no cluster there, or a malformed address.
    """
    text = address.strip()
    if text == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address_or_die

            text = canonicalize_bootstrap_address_or_die("auto")
        except (ConnectionError, ValueError) as exc:
            raise ConfigError(f"--ray-address auto: no running Ray cluster found ({first_line(str(exc))})") from None
    host, port, client = parse_ray_address(text)
    if client and importlib.util.find_spec("grpc") is None:
        raise ConfigError(f"--ray-address {address}: ray:// (Ray Client) needs pip install 'ray[client]'")
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConfigError(f"--ray-address {address}: no Ray cluster answers at {host}:{port} "
                          f"({exc.strerror or type(exc).__name__}); is it running (`ray start --head`)?") from None
    return text


# --- the workers' side -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RayWorker:
    """What a Ray worker learned when it joined the run.

    Attributes:
        rank: Global rank.
        attempt: Which attempt of the run this is (0 for the first; more after Ray restarted the workers).
        nnodes: Nodes taking part.
        run_dir: The run directory.
        device: The device collectives run on (where the stop check's number lives).
    """

    rank: int
    attempt: int
    nnodes: int
    run_dir: Path
    device: torch.device

    @property
    def stop_path(self) -> Path:
        """The file the driver writes to stop the run."""
        return self.run_dir / RAY_DIR / STOP_FILE

    def stop_requested(self) -> int:
        """The signal the driver was stopped with, agreed by all ranks (0: none). A collective: every rank calls it
        at the same step."""
        mine = _read_signal(self.stop_path)
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return mine
        value = torch.tensor([mine], dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())


def worker_environ(contract: LaunchContract) -> dict[str, str]:
    """The environment a Ray worker gets from the driver (it inherits none): the driver's own ``DTPO_*`` user
    settings (``DTPO_STATE_DIR``, ``DTPO_STORE``, ...), as torchrun's workers have them, and the contract."""
    env = {key: value for key, value in os.environ.items() if key.startswith("DTPO_") and key not in ENVIRON_NAMES}
    env.update((key, value) for key, value in contract.to_environ().items() if value is not None)
    return env


def join_ray_worker(env: dict[str, str], run_dir: str | os.PathLike[str]) -> RayWorker:
    """Set up a Ray worker for the Session: the driver's environment (``DTPO_LAUNCHED``, the run directory, ...),
    the attempt number (``TORCHELASTIC_RESTART_COUNT``) and the node count (``GROUP_WORLD_SIZE``), agreed with one
    all-reduce over the process group Ray Train set up.

    Args:
        env: Environment variables the driver gives every worker.
        run_dir: The run directory.
    """
    import ray.train

    os.environ.update(env)
    logging.getLogger("ray.train").setLevel(logging.WARNING)  # not a line per ray.train.report
    context = ray.train.get_context()
    rank = context.get_world_rank()
    folder = Path(run_dir) / RAY_DIR
    attempt = _next_attempt(folder) if rank == 0 else 0
    node = context.get_node_rank()
    device = _collective_device()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        agreed = torch.tensor([attempt, node + 1], dtype=torch.int64, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        attempt, nnodes = (int(v) for v in agreed.tolist())
    else:
        nnodes = node + 1
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
    os.environ["GROUP_WORLD_SIZE"] = str(nnodes)
    return RayWorker(rank, attempt, nnodes, Path(run_dir), device)


def _collective_device() -> torch.device:
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _next_attempt(folder: Path) -> int:
    """Rank 0: this attempt's number, counted in ``folder/attempt``."""
    path = folder / ATTEMPT_FILE
    try:
        attempt = int(path.read_text().strip()) + 1
    except (OSError, ValueError):
        attempt = 0
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{attempt}\n")
    return attempt


def _read_signal(path: Path) -> int:
    try:
        return int(path.read_text().strip() or signal.SIGTERM)
    except FileNotFoundError:
        return 0
    except (OSError, ValueError):
        return int(signal.SIGTERM)


def checkpoint_for_ray(path: Path, run_dir: Path, scratch: Path) -> tuple[Any, bool]:
    """A complete dtpo checkpoint folder as a :class:`ray.train.Checkpoint`.

    Inside the run directory (Ray Train's experiment directory) the DCP folder itself is the checkpoint, reported
    without a copy. Elsewhere (``--checkpoint-dir``) Ray gets a small pointer checkpoint (``dtpo-checkpoint.json``
    naming the folder), Ray's own pattern for checkpoints kept outside its storage.

    Returns:
        The checkpoint, and whether Ray must copy it into its storage (the pointer).
    """
    from ray.train import Checkpoint

    if path.resolve().is_relative_to(run_dir.resolve()):
        return Checkpoint.from_directory(str(path)), False
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / POINTER_FILE).write_text(json.dumps({"path": str(path.resolve())}))
    return Checkpoint.from_directory(str(scratch)), True


POINTER_FILE = "dtpo-checkpoint.json"


def checkpoint_from_ray(checkpoint: Any) -> Path | None:
    """The dtpo checkpoint folder a :class:`ray.train.Checkpoint` stands for (see :func:`checkpoint_for_ray`)."""
    if checkpoint is None:
        return None
    path = Path(checkpoint.path)
    pointer = path / POINTER_FILE
    if pointer.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return Path(json.loads(pointer.read_text())["path"])
        return None
    return path if path.is_dir() else None


# --- the driver's side -------------------------------------------------------------------------------------


def launch_on_ray(train_fn: Callable[[dict[str, Any]], None], config: RunConfig, run_dir: Path,
                  config_path: Path) -> LaunchOutcome:
    """Run ``train_fn`` on ``config.launch.workers`` Ray Train workers and wait for them.

    Args:
        train_fn: The training function each worker runs (``dtpo.workloads.ray_train.train_loop``); it receives
            ``{"config": PATH, "run_dir": ..., "env": {...}}``.
        config: The resolved configuration (``launch.ray_address`` already checked).
        run_dir: The prepared run directory (Ray Train's experiment directory too).
        config_path: Where ``config`` was saved for the workers.

    Returns:
        How the run ended: the outcome ``conclude_run`` turns into the record, also for failed and interrupted
        runs.
    """
    check_ray_installed(connecting=config.launch.ray_address is not None)
    import ray
    from ray.train import FailureConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from dtpo.distributed.ray_callback import AttemptErrors

    launch = config.launch
    threads = launch.threads_per_worker or 1
    use_gpu = torch.cuda.is_available() and launch.backend != "gloo"
    folder = run_dir / RAY_DIR
    _fresh_bookkeeping(run_dir, folder)
    env = worker_environ(LaunchContract(config=config_path, launched=True, launcher=LAUNCHER_NAME, run_dir=run_dir,
                                        backend=launch.backend or LaunchContract.from_environ().backend))
    env["OMP_NUM_THREADS"] = str(threads)
    trainer = TorchTrainer(
        train_fn,
        train_loop_config={"config": str(config_path), "run_dir": str(run_dir), "env": env},
        scaling_config=ScalingConfig(num_workers=launch.workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": threads, **({"GPU": 1} if use_gpu else {})}),
        torch_config=TorchConfig(backend=launch.backend or ("nccl" if use_gpu else "gloo")),
        run_config=RayRunConfig(name=run_dir.name, storage_path=str(run_dir.parent),
                                failure_config=FailureConfig(max_failures=launch.max_restarts),
                                callbacks=[AttemptErrors(str(folder / ERRORS_FILE))]),
    )
    state = _RunState()
    log_path = run_dir / LAUNCHER_LOG
    signals: list[int] = []  # SIGINT / SIGTERM received, from the start (Ray takes a while to start)
    started_here = launch.ray_address is None and not ray.is_initialized()
    try:
        with _ray_logs(log_path), worker_environment({"OMP_NUM_THREADS": str(threads)}), \
                _signals_recorded(signals):
            with _stderr_to(log_path):  # what Ray's C++ side and the processes ray.init starts print
                _start_ray(launch.ray_address, launch.workers * threads, use_gpu)
            _route_worker_output(log_path)
            if signals:
                state.signum = signals[0]
            else:
                with _signals_recorded(signals):  # again: Ray's core put its own SIGTERM handler in place
                    _fit_until_done(trainer, state, signals)
    finally:
        if started_here and ray.is_initialized():
            with contextlib.suppress(Exception), _ray_logs(log_path), _stderr_to(log_path):
                ray.shutdown()
    return _outcome(state, run_dir, folder)


@dataclass
class _RunState:
    result: Any = None
    error: BaseException | None = None
    signum: int | None = None
    abandoned: bool = False


def _fresh_bookkeeping(run_dir: Path, folder: Path) -> None:
    """Remove what an earlier run left in this directory (``--overwrite``): dtpo's Ray files and Ray Train's
    saved run state, which Ray would otherwise restore as if this were that run."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob("checkpoint_manager_snapshot*.json"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _start_ray(address: str | None, cpus: int, use_gpu: bool) -> None:
    """Connect to the cluster at ``address``, or start a local Ray instance for the run."""
    import ray

    if ray.is_initialized():
        return
    common: dict[str, Any] = {"include_dashboard": False, "configure_logging": False, "log_to_driver": True}
    if address is not None:
        try:
            ray.init(address=address, **common)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise LaunchError(f"--ray-address {address}: cannot connect to Ray ({first_line(str(exc))}; a cluster "
                              "with token authentication needs its token: RAY_AUTH_TOKEN or ~/.ray/auth_token)"
                              ) from None
        return
    ray.init(address="local", num_cpus=max(cpus, 1), num_gpus=torch.cuda.device_count() if use_gpu else 0,
             **common)


def _route_worker_output(log_path: Path) -> None:
    """What Ray forwards to the driver: the training workers' output to the terminal as they wrote it (dtpo's
    lines carry their rank already), everything else (Ray Train's controller and helpers) to ``log_path``.

    Hand-written on Ray's log dispatcher (``ray._private.ray_logging``, no public API); where it is not found,
    Ray's own printing stays.
    """
    try:
        from ray._private import worker as ray_worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return
    if not any(name == "ray_print_logs" for name, _ in dispatcher.handlers):
        return

    def route(data: dict[str, Any]) -> None:
        if data.get("actor_name") == "RayTrainWorker" or str(data.get("task_name", "")).startswith("RayTrainWorker"):
            ray_worker.print_to_stdstream(data, ignore_prefix=True)
            return
        with contextlib.suppress(OSError), log_path.open("a") as out:
            name = data.get("actor_name") or data.get("task_name") or data.get("pid")
            out.writelines(f"({name}) {line}\n" for line in data.get("lines", []))

    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", route)


def _auth_token_available() -> bool:
    """Whether Ray would find an authentication token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, or
    ``~/.ray/auth_token``, where ``ray start --head`` writes it)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    return Path(path).expanduser().is_file()


def _fit_until_done(trainer: Any, state: _RunState, signals: list[int]) -> None:
    """``trainer.fit()`` in a thread, while this (main) thread turns SIGINT/SIGTERM (appended to ``signals``) into
    a stop request."""

    def fit() -> None:
        try:
            state.result = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - reported through the outcome
            state.error = exc

    thread = threading.Thread(target=fit, name="dtpo-ray-fit", daemon=True)
    thread.start()
    deadline: float | None = None
    while thread.is_alive():
        thread.join(0.2)
        if signals and state.signum is None:
            state.signum = signals[0]
            _request_stop(state.signum, trainer)
            deadline = time.monotonic() + STOP_GRACE_S
            log.info("stopping the Ray workers (%s) ...", signal_name(state.signum))
        if deadline is not None and (len(signals) > 1 or time.monotonic() > deadline):
            state.abandoned = True
            log.warning("the Ray workers did not stop; ending Ray")
            return


def _request_stop(signum: int, trainer: Any) -> None:
    path = Path(trainer.train_loop_config["run_dir"]) / RAY_DIR / STOP_FILE
    with contextlib.suppress(OSError):
        path.write_text(f"{signum}\n")


@contextlib.contextmanager
def _signals_recorded(signals: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM append to ``signals`` instead of ending the process (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, lambda signum, frame: signals.append(signum))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def _ray_logs(path: Path) -> Iterator[None]:
    """Ray's own driver-side log records go to ``RUN_DIR/launcher.log`` (the workers' output still reaches the
    terminal, as under torchrun)."""
    logger = logging.getLogger("ray")
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved_handlers, saved_propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [handler], False
    try:
        yield
    finally:
        logger.handlers, logger.propagate = saved_handlers, saved_propagate
        handler.close()


def _outcome(state: _RunState, run_dir: Path, folder: Path) -> LaunchOutcome:
    """The :class:`LaunchOutcome` of a Ray run, as ``dtpo launch`` would have described it."""
    errors = _attempt_errors(folder / ERRORS_FILE)
    try:
        attempts = int((folder / ATTEMPT_FILE).read_text().strip()) + 1
    except (OSError, ValueError):
        attempts = 0
    restarts = max(attempts - 1, 0)
    failed, message = False, None
    if state.signum is not None:
        failed, message = True, f"interrupted by {signal_name(state.signum)}"
    elif state.error is not None:
        failed, message = True, describe_ray_error(state.error)
    elif state.result is not None and getattr(state.result, "error", None) is not None:
        failed, message = True, describe_ray_error(state.result.error)
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        (run_dir / ".validate_storage_marker").unlink(missing_ok=True)  # Ray Train's check that it can write there
    recorded = holds_record(run_dir)
    return LaunchOutcome(run_dir, failed, message, state.signum, restarts, tuple(errors[:restarts]), recorded,
                         launcher="Ray Train")


def _attempt_errors(path: Path) -> list[str]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(str(json.loads(line)["error"]))
    return out


def describe_ray_error(error: BaseException) -> str:
    """One line for why a Ray run failed: the first rank's own error out of Ray Train's ``WorkerGroupError``."""
    failures = getattr(error, "worker_failures", None)
    if isinstance(failures, dict) and failures:
        return describe_worker_failures(failures)
    inner = getattr(error, "controller_failure", None)
    return first_line(str(inner if inner is not None else error)) or type(error).__name__
