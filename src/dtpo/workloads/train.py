"""The training script behind ``dtpo train``: one built-in workload, trained with :class:`dtpo.Session`.

It reads its whole configuration as data: the :class:`~dtpo.core.config.RunConfig` JSON (or TOML) file
named by ``$DTPO_CONFIG`` or by its only argument (default: every setting at its default). It runs three ways::

    dtpo train --workload lm                                    # writes RUN_DIR/config.json, launches this
    dtpo launch --nproc-per-node 4 -m dtpo.workloads.train my.toml
    python -m dtpo.workloads.train my.toml                        # one plain process
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import torch

import dtpo
from dtpo.core.callbacks import Callback
from dtpo.core.config import RunConfig
from dtpo.core.errors import ConfigError, DtpoError, first_line
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.logs import configure_logging
from dtpo.distributed.oom import says_out_of_memory
from dtpo.distributed.process_group import lost_a_peer
from dtpo.session.lifecycle import Interrupted
from dtpo.workloads import get_workload, with_workload_defaults
from dtpo.workloads.evaluation import evaluate

log = logging.getLogger("dtpo.workloads.train")  # also when run as __main__


def load_config(argv: list[str]) -> RunConfig:
    """The run's configuration: the file given as the only argument, else ``$DTPO_CONFIG``, else defaults."""
    if len(argv) > 1:
        raise ConfigError(f"dtpo.workloads.train takes one configuration file, got {len(argv)} arguments: "
                          f"{' '.join(argv)}")
    path = argv[0] if argv else LaunchContract.from_environ().config
    return RunConfig.load(path) if path else RunConfig()


def train(config: RunConfig, callbacks: Sequence[Callback] = ()) -> None:
    """Build the workload, train it for its steps, evaluate it on the workload's fixed evaluation set, write the
    record (``config`` with the workload's defaults filled in: :func:`~dtpo.workloads.with_workload_defaults`);
    ``callbacks`` go to the Session (the Ray engine's)."""
    workload = get_workload(config.workload.name)
    steps, batch_size, lr = config.workload.steps, config.workload.batch_size, config.workload.lr
    assert steps is not None and batch_size is not None and lr is not None, "call with_workload_defaults first"
    if config.launch.threads_per_worker is not None:
        torch.set_num_threads(config.launch.threads_per_worker)
    session = dtpo.Session.from_config(config, callbacks=callbacks)
    with session:
        torch.manual_seed(config.workload.seed)  # identical initial replicas on every rank
        model = session.wrap(workload.build_model())
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        session.attach(optimizer)  # saved in checkpoints (--checkpoint-every), restored on --resume or a restart
        if session.batch_shares is not None:  # --tune rebalance: every rank draws the global batch, takes its share
            data = workload.batches(batch_size * session.world_size, 0, 1, seed=config.workload.seed)
        else:
            data = workload.batches(batch_size, session.rank, session.world_size, seed=config.workload.seed)
        for inputs, targets in session.batches(data, steps=steps):
            loss = workload.loss(model(inputs), targets)
            session.backward(loss)
            session.step(optimizer)
        session.close_window()  # the evaluation counts in no window, nor in the run's energy per sample
        result = evaluate(model, workload, session.device, session.rank, session.world_size)
        session.note_evaluation(result.loss, result.samples)


def check_checkpoints(config: RunConfig, run_dir: str | os.PathLike[str] | None = None) -> None:
    """What ``dtpo train`` checks of ``--checkpoint-*`` and ``--resume`` before any worker starts: the checkpoint
    directory is writable, and the checkpoint to resume is complete, of this workload's model and of this
    number of workers (``config`` with the workload's defaults filled in).

    Raises:
        ConfigError: One line; nothing is written or overwritten.
    """
    from pathlib import Path

    from dtpo.session.checkpoint.files import check_checkpoint_config
    from dtpo.session.checkpoint.state import model_fingerprint

    if not config.checkpoint.enabled:
        return
    torch.manual_seed(config.workload.seed)
    fingerprint = model_fingerprint(get_workload(config.workload.name).build_model())
    folder = run_dir if run_dir is not None else config.launch.run_dir
    check_checkpoint_config(config.checkpoint, Path(folder) if folder is not None else None,
                            config.launch.workers, fingerprint)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one line and exit code 2 for a bad setting; quiet exits on interrupts."""
    configure_logging()
    config: RunConfig | None = None
    try:
        config = with_workload_defaults(load_config(sys.argv[1:] if argv is None else argv))
        train(config)
    except DtpoError as exc:
        log.error("%s", exc)
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        sys.exit(128 + exc.signum)
    except KeyboardInterrupt:
        sys.exit(130)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        if lost_a_peer(exc):  # its record keeps the error; the launcher names the rank that stopped
            log.error("a collective failed because another rank stopped: %s", first_line(str(exc)))
            sys.exit(1)
        if not isinstance(exc, torch.OutOfMemoryError | MemoryError) and not says_out_of_memory(str(exc)):
            raise
        log.error("out of memory: a micro-batch of %s samples does not fit on this device; lower --batch-size",
                  config.workload.batch_size if config is not None else "the configured number of")
        sys.exit(1)


if __name__ == "__main__":
    from dtpo.distributed.worker_exit import run_then_exit

    run_then_exit(main)
