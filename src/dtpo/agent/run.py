"""The agent's producer of the step stream: :class:`AgentRun`, one rank's run of an unmodified script.

It gets what a :class:`~dtpo.session.session.Session` run gets from the same stream (record, energy windows,
the GPU knobs and their tuner, straggler slack where DDP is used, live metrics), from the steps the
:class:`~dtpo.agent.tracker.StepTracker` cuts. It starts at the end of the script's first training iteration.
It ends together with the other ranks when the script destroys its process group (rank 0 gathers every rank's
record over the agent's group, as a Session does, and writes ``record.json``), else without a collective when the
process exits (or is stopped by SIGTERM): each rank writes its partial record, and ``dtpo launch`` assembles
``record.json`` from those on its node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from dtpo.core.config import RunConfig
from dtpo.core.record import RankRecord, StepRecord
from dtpo.core.steps import SettingView
from dtpo.distributed.process_group import DistContext
from dtpo.session.environment import describe_device
from dtpo.session.lifecycle import agree_on_run_dir
from dtpo.session.stream_run import StreamProducer, StreamRun, new_record

log = logging.getLogger(__name__)


class AgentRun(StreamProducer):
    """One rank's run of a script the agent measures.

    Args:
        ctx: Where this rank sits (:func:`~dtpo.agent.channel.agent_context`).
        run_config: The run's configuration (``dtpo launch``'s flags, or the defaults).
        script: The script's name, for the record.
        clock: Seconds for the power tuner's blocks (``time.perf_counter``; tests pass a simulated GPU's).
    """

    def __init__(self, ctx: DistContext, run_config: RunConfig, script: str,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(ctx)
        run_config = run_config.replace(session={"count_flops": False}, workload={"name": f"script:{script}"})
        self.run_config = run_config
        self.config = run_config.session
        self.target_steps: int | None = None
        self.start_step = 0
        self.run_dir: Path = agree_on_run_dir(ctx, None)
        record = new_record(ctx, self.run_dir, run_config, {"script": script, "measured_by": "dtpo launch agent"})
        rank = RankRecord(ctx.rank, ctx.local_rank, ctx.node, describe_device(ctx.device))
        self._run = StreamRun(self, ctx, self.run_dir, run_config, record, rank, (), progress=False, summary=False,
                              clock=clock)
        self._steps = 0
        self._run.stream.train_start()
        self._run.stream.step_begin(0)

    @property
    def switches(self) -> Mapping[str, SettingView]:
        """No setting of an unmodified script switches between steps."""
        return {}

    @property
    def step_count(self) -> int:
        """Steps recorded so far."""
        return self._steps

    def step_opened(self, step: int) -> None:
        """The script's next iteration began."""
        self._run.stream.step_begin(step)

    def step_closed(self, record: StepRecord) -> None:
        """It ended."""
        self.lifecycle.rank.steps.append(record)
        self._steps += 1
        self._run.stream.step_end(record)

    def finish(self, error: BaseException | None = None, together: bool = False) -> None:
        """End this rank's run: close the open window, let the callbacks finish (GPU settings go back), write the
        partial record with how the script ended, without a collective.

        Args:
            error: What the script died of, if anything.
            together: Every rank ends now, while the script's process group (and so the agent's own) still
                stands: the ranks gather their records to rank 0 over the agent's group, and rank 0 writes
                ``record.json`` with every rank, on whichever node it runs (no shared file system needed).
        """
        if self.lifecycle.finished:
            return
        self._run.stream.close_window()
        self._run.finish(error, alone=not together or self.ctx.group is None)

    def finish_together(self) -> None:
        """Every rank ends now, with its records gathered to rank 0 (``finish(together=True)``)."""
        self.finish(together=True)

    def abandon(self) -> None:
        """Stand aside without writing anything more (the script drives a producer of its own)."""
        self.lifecycle.finished = True
