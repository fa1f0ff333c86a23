"""Concluding a launched run: make sure its record exists, print its summary."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from dtpo.core.errors import DtpoError, signal_name
from dtpo.core.record import RECORD_FILE, RunRecord, load_partial_records, partial_attempts
from dtpo.core.totals import add_recovery, attempt_summary, record_from_partials
from dtpo.distributed.oom import OUT_OF_MEMORY, says_out_of_memory
from dtpo.telemetry.artifacts import write_artifacts
from dtpo.telemetry.summary import make_console, print_summary

if TYPE_CHECKING:
    from dtpo.distributed.launch import LaunchOutcome
    from dtpo.distributed.stall import Stall

log = logging.getLogger(__name__)

# What a rank says when it was only stopped because another one failed: not the run's real error.
_SECONDARY_ERRORS = ("interrupted by SIGTERM", "terminated by SIGTERM")
# The launcher's line for a rank the OOM killer ended (dtpo.distributed.launch, dtpo.distributed.oom).
_KILLED_FOR_MEMORY = re.compile(rf"rank (\d+) was killed by \w+: ({OUT_OF_MEMORY} \([^)]*\))")


def merged_status(outcome: LaunchOutcome, partial_statuses: list[str]) -> str:
    """The status of a run that did not end with rank 0's record: interrupted, stalled, diverged or failed."""
    if outcome.interrupted:
        return "interrupted"
    if outcome.stall is not None:
        return "stalled"
    if "diverged" in partial_statuses:
        return "diverged"
    return "failed"


def first_real_error(errors: dict[int, str | None], launcher_message: str | None) -> str | None:
    """The error that ended the run: the rank the launcher saw fail first (its own record's words), else a
    rank's own failure rather than the SIGTERMs of the ranks stopped after it."""
    failed = re.match(r"rank (\d+) exited", launcher_message or "")
    if failed and errors.get(int(failed.group(1))):
        return errors[int(failed.group(1))]
    real = [e for _, e in sorted(errors.items()) if e and not e.startswith(_SECONDARY_ERRORS)]
    return launcher_message or (real[0] if real else next((e for e in errors.values() if e), None))


def memory_errors(errors: dict[int, str | None], launcher_message: str | None) -> dict[int, str]:
    """The ranks that ran out of memory, by rank, with what their records say: the OOM kill the launcher's line
    names ("out of memory (the kernel's OOM killer ended it ...)"), or their own allocation error prefixed with
    "out of memory: "."""
    out: dict[int, str] = {}
    killed = _KILLED_FOR_MEMORY.match(launcher_message or "")
    if killed:
        out[int(killed.group(1))] = killed.group(2)
    for rank, error in errors.items():
        if error and rank not in out and says_out_of_memory(error):
            out[rank] = error if error.startswith(OUT_OF_MEMORY) else f"{OUT_OF_MEMORY}: {error}"
    return out


def conclude_run(outcome: LaunchOutcome, console: Console | None = None, quiet: bool = False) -> RunRecord | None:
    """After the workers of this node exit: load (or, for a run that did not complete, assemble) the record
    and print it.

    Returns:
        The record, or ``None`` when this node holds none (a node other than rank 0's of a completed run,
        or a run that stopped before measuring anything).
    """
    console = console or make_console()
    path = Path(outcome.run_dir) / RECORD_FILE
    record: RunRecord | None = None
    if not outcome.failed and path.is_file():
        record = RunRecord.load(path)
    elif not outcome.failed:  # the agent's ranks end alone: their partial records make the run's record
        partials = load_partial_records(outcome.run_dir)
        if partials and all(p.status == "completed" for p in partials):
            record = record_from_partials(outcome.run_dir, "completed", None, partials)
            if record is not None:
                record.save(outcome.run_dir)
    else:
        partials = load_partial_records(outcome.run_dir)
        status = merged_status(outcome, [p.status for p in partials])
        diverged = [p.error for p in partials if p.status == "diverged"]
        errors = {p.ranks[0].rank: p.error for p in partials if p.ranks}
        memory = memory_errors(errors, outcome.message)
        error = diverged[0] if diverged else first_real_error({**errors, **memory}, outcome.message)
        failed = re.match(r"rank (\d+) exited", outcome.message or "")
        if failed and int(failed.group(1)) in memory and not diverged:  # the rank's own words, with its number
            error = f"rank {failed.group(1)}: {memory[int(failed.group(1))]}"
        if status == "interrupted":
            error = outcome.message or "interrupted"
        record = record_from_partials(outcome.run_dir, status, error, partials, rank_errors=memory)
        if record is not None:
            if outcome.stall is not None:
                name_stalled_ranks(record, outcome.stall)
            record.save(outcome.run_dir)
    if record is not None and outcome.restarts:
        add_restarts(record, outcome)
        record.save(outcome.run_dir)
    written = write_artifacts(record, outcome.run_dir) if record is not None else []
    if record is not None and not quiet:
        print_summary(record, console, record_path=str(path))
        for artifact in written:
            what = "trace (Perfetto, chrome://tracing)" if artifact.suffix == ".json" else "report"
            console.print(f"{what}: {artifact}", soft_wrap=True)
    return record


def name_stalled_ranks(record: RunRecord, stall: Stall) -> None:
    """The ranks the launcher stopped for making no progress say so, rather than that they were killed."""
    at = "before the first step" if stall.step is None else f"at step {stall.step}"
    if stall.lost is None:
        error = f"stalled {at}: no progress for {stall.idle_s:.1f} s; stopped by the launcher"
    elif stall.lost.this_node:
        error = f"cut off from the rendezvous host {stall.lost.node} {at}; stopped by the launcher"
    else:
        error = f"waited {at} for node {stall.lost.node}, which was lost; stopped by the launcher"
    for rank in record.ranks:
        if rank.rank in stall.ranks:
            rank.error = error


def add_restarts(record: RunRecord, outcome: LaunchOutcome) -> None:
    """Keep every earlier attempt of a restarted run in its record: steps, time, energy and first error."""
    attempts = partial_attempts(outcome.run_dir)
    earlier = [a for a in attempts if a < record.attempt] or list(range(outcome.restarts))
    record.restarts = []
    for attempt in earlier:
        partials = load_partial_records(outcome.run_dir, attempt)
        error = outcome.attempt_errors[attempt] if attempt < len(outcome.attempt_errors) else None
        statuses = {p.status for p in partials}
        status = "diverged" if "diverged" in statuses else "stalled" if outcome.stall_of(attempt) else "failed"
        restart = attempt_summary(partials, attempt, status, error)
        if attempt + 1 == record.attempt:
            resumed, following = record.resumed, record.ranks
        else:
            later = load_partial_records(outcome.run_dir, attempt + 1)
            resumed = next((p.resumed for p in later if p.resumed), None)
            following = [r for p in later for r in p.ranks]
        record.restarts.append(add_recovery(restart, partials, resumed, following))


class RunEnded(DtpoError):
    """A launched run did not complete: the message is the one line the user sees, with its exit code
    (130 / 143 for SIGINT / SIGTERM, 1 for a failed or diverged run)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def end_run(outcome: LaunchOutcome, record: RunRecord | None, script: str | None = None, agent: bool = False,
            framework: str = "torch") -> None:
    """Say in one line how a launch ended when it did not simply complete with a record (``agent``: the script
    was measured by the in-process agent; ``framework``: what it computes with).

    Raises:
        RunEnded: The run was interrupted (exit code 128 + the signal), diverged or failed (exit code 1).
    """
    if outcome.restarts:
        log.warning("%s restarted the workers %d time%s (%s)", outcome.launcher, outcome.restarts,
                    "s" if outcome.restarts > 1 else "", "; ".join(
                        f"attempt {i}: {error}" for i, error in enumerate(outcome.attempt_errors)))
    if record is not None:
        where = f"record in {outcome.run_dir}"
    elif outcome.recorded:
        where = f"partial records in {outcome.run_dir}"
    else:
        where = "nothing was recorded"
    if outcome.signal is not None:
        raise RunEnded(f"interrupted by {signal_name(outcome.signal)}; {where}", 128 + outcome.signal)
    if record is not None and record.status == "diverged":
        raise RunEnded(f"run diverged: {record.error or 'the loss is not finite'}; {where}", 1)
    if outcome.failed:
        ended = "stalled" if outcome.stall is not None else "failed"
        message = outcome.message or "a worker failed"
        if record is not None and record.error and ":" not in message and not record.error.startswith(message):
            # the launcher saw an exit code only: the record has the words (an allocation error, a failed checkpoint)
            message = record.error if record.error.startswith("rank ") else f"{message}: {record.error}"
        raise RunEnded(f"run {ended}: {message}; {where}", 1)
    if not outcome.recorded:
        if script is None:
            raise RunEnded(f"the workers finished but recorded nothing; {where}", 1)
        if agent and framework != "torch":  # the worker said which tracker to call (dtpo.frameworks.bootstrap)
            return
        if agent:
            log.warning("the workers finished, but nothing was recorded: %s never stepped a torch optimizer "
                        "(inference only?), so there were no training steps to measure", script)
        else:
            log.warning("the workers finished, but nothing was recorded: %s does not use dtpo.Session (and "
                        "--no-agent kept the agent out)", script)
