"""The training function each Ray Train worker runs for ``dtpo train --engine ray``: the same
:func:`dtpo.workloads.train.train` as under torchrun, with a Session callback for what Ray needs.

:func:`train_loop` joins the run (:func:`dtpo.distributed.ray_engine.join_ray_worker`: environment, attempt number),
resumes from the checkpoint Ray hands back after a restart (``ray.train.get_checkpoint()``), and trains.
:class:`RayCallback` reports every complete dtpo checkpoint to Ray Train (``ray.train.report`` with a
:class:`ray.train.Checkpoint` of the DCP folder) and stops the run, every rank at the same step, when the driver
was interrupted.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dtpo.core.callbacks import Callback
from dtpo.core.config import RunConfig
from dtpo.core.logs import configure_logging
from dtpo.distributed.ray_engine import (
    STOP_CHECK_EVERY,
    RayWorker,
    checkpoint_for_ray,
    checkpoint_from_ray,
    join_ray_worker,
)
from dtpo.session.lifecycle import Interrupted
from dtpo.workloads import with_workload_defaults
from dtpo.workloads.train import train

log = logging.getLogger(__name__)


def train_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``: train the run's workload on this worker.

    Args:
        loop_config: ``{"config": PATH, "run_dir": PATH, "env": {...}}`` from
            :func:`dtpo.distributed.ray_engine.launch_on_ray`.
    """
    configure_logging()
    worker = join_ray_worker(loop_config["env"], loop_config["run_dir"])
    if worker.stop_requested():  # interrupted before this attempt started: nothing to do
        return
    config = with_workload_defaults(RunConfig.load(loop_config["config"]))
    config = resume_from_ray(config, worker)
    try:
        train(config, callbacks=[RayCallback(worker)])
    except Interrupted:
        return  # the driver was interrupted: the Session wrote this rank's partial record; Ray need not restart


def resume_from_ray(config: RunConfig, worker: RayWorker) -> RunConfig:
    """After a restart, resume from the checkpoint Ray Train hands back (unless ``--resume`` names one); the
    Session itself prefers the newest complete checkpoint of the run's own checkpoint directory."""
    import ray.train

    path = checkpoint_from_ray(ray.train.get_checkpoint())
    if path is None or worker.attempt == 0 or config.checkpoint.resume is not None:
        return config
    if worker.rank == 0:
        log.info("Ray Train restarted the workers (attempt %d): resuming from %s", worker.attempt, path)
    return config.replace(checkpoint={"resume": str(path)})


class RayCallback(Callback):
    """Reports dtpo's checkpoints to Ray Train and stops the run when the driver asks.

    Args:
        worker: What this worker learned when it joined the run.
    """

    def __init__(self, worker: RayWorker) -> None:
        self.worker = worker
        self._saves = 0
        self._reported: Path | None = None

    def on_step_begin(self, session: Any, step: int) -> None:
        """Every :data:`~dtpo.distributed.ray_engine.STOP_CHECK_EVERY` steps, all ranks together: stop when asked."""
        if (step - session.start_step) % STOP_CHECK_EVERY:
            return
        signum = self.worker.stop_requested()
        if signum:
            raise Interrupted(signum)

    def on_step_end(self, session: Any, step_record: Any) -> None:
        """After a step that followed a checkpoint save (every rank saves at the same step): report it."""
        saves = len(session.rank_record.checkpoints)
        if saves > self._saves:
            self._saves = saves
            self._report(session)

    def on_train_end(self, session: Any, record: Any) -> None:
        """At a normal end: report the last checkpoint, if it was not yet."""
        if session.rank_record.error is None and session.checkpoints.enabled:
            self._report(session)

    def _report(self, session: Any) -> None:
        """``ray.train.report`` on every rank (a barrier); rank 0 passes the newest complete checkpoint."""
        import ray.train
        from ray.train import CheckpointUploadMode

        checkpoints = session.checkpoints
        root = checkpoints.root
        inside = root is not None and Path(root).resolve().is_relative_to(self.worker.run_dir.resolve())
        mode = CheckpointUploadMode.NO_UPLOAD if inside else CheckpointUploadMode.SYNC
        metrics = {"step": session.step_count, "attempt": self.worker.attempt}
        saved = checkpoints.saved if self.worker.rank == 0 else None
        if saved is None or saved.path == self._reported:
            ray.train.report(metrics, checkpoint_upload_mode=mode)
            return
        scratch = Path(tempfile.mkdtemp(prefix="dtpo-ray-checkpoint-"))
        try:
            checkpoint, _ = checkpoint_for_ray(saved.path, self.worker.run_dir, scratch)
            ray.train.report({**metrics, "checkpoint_step": saved.step}, checkpoint=checkpoint,
                             checkpoint_dir_name=None if inside else f"ray-pointer-{saved.path.name}",
                             checkpoint_upload_mode=mode)
            self._reported = saved.path
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
