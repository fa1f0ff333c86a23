"""``--tune precision,grad-accum,compression``: the job knobs tuned while training, numerics guarded.

The search is the power tuner's (:class:`~dtpo.tune.tuner.PowerTuner`: pooled noise, quick looks, racing,
drops re-judged at every decision), run over :class:`~dtpo.tune.job_setting.JobSetting` s one knob at a
time. Blocks of steps are measured on every rank (time, samples, energy of the devices this rank counts,
the loss and the exposed communication of each step) and agreed with one all-reduce pair, so every rank
feeds its tuner the same figures and takes the same decisions, and applies them to its own Session between
the same two steps.

What is never profiled:

* a precision whose measured (CPU) or datasheet (GPU) matmul peak is below ``1 / screen_slowdown`` of
  float32's on this device: no bf16 units, say (:func:`~dtpo.session.loop.mfu.peak_flops`);
* the compression knob when communication is a small share of the step (``min_comm_share``): compression can
  only save what communication costs;
* a setting that changes numerics and fails the convergence guard (:mod:`dtpo.tune.guard`): before it trains,
  its gradient on a kept probe batch is compared with the exact one (probe steps: :mod:`dtpo.session.loop.probe`);
  while it is profiled, its loss is watched. What was rejected and why is in the record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from dtpo.core.callbacks import Callback
from dtpo.core.config import PRECISIONS, TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.core.record import RankRecord, StepRecord
from dtpo.core.record_sections import JobTuning
from dtpo.core.steps import TunableRun
from dtpo.core.tuner_status import TunerState
from dtpo.session.loop.precision import Precision
from dtpo.session.loop.probe import ProbeRequest, ProbeResult
from dtpo.tune.cost import CostContext, parse_cost
from dtpo.tune.guard import GuardOptions, Verdict, cosine_similarity, judge_loss, judge_probe
from dtpo.tune.job_setting import JobSetting, JobSpace, job_knobs
from dtpo.tune.stats import Block, SettingStats
from dtpo.tune.tuner import Phase, PowerTuner, TunerOptions

log = logging.getLogger(__name__)

MIN_COMM_SHARE = 0.10
"""Below this share of step time spent in exposed communication, the compression knob is not searched."""

LOSS_HISTORY_STEPS = 8
"""Steps of loss before a switch that a candidate's loss is compared with."""

EXACT = ("32-true", "none", 1)
"""The reference of every probe: float32, exact all-reduce."""


def job_tuner_options() -> TunerOptions:
    """The power tuner's search, set for job knobs: unordered candidates, a one-step quick look (a bad
    precision or accumulation is off by far more than the noise), blocks of at least 0.2 s (energy counters
    and the modelled CPU's /proc/stat tick at 10 ms), and 3 s (at most 5 % of the job) of waiting before the
    starting setting is measured (the first second of a job on a CPU can run at two thirds of its later
    speed, which would make every other setting look better than the one the job started with). No near-tie
    refining while holding (``refine_steps=0``): switching precision, accumulation or compression back and forth
    every hold block would restart what each carries (PowerSGD's error feedback, an accumulation re-cut) and
    put a probe's numerics into the training itself."""
    return TunerOptions(ordered=False, quick_look_steps=1, min_block_s=0.2, min_warmup_s=0.0, min_wait_s=3.0,
                        refine_steps=0)


def _batch_norm_layer(model: torch.nn.Module | None) -> str | None:
    """The class name of a layer whose output depends on the other samples of its batch, if the model has one."""
    if model is None:
        return None
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            return type(module).__name__
    return None


class JobTuneCallback(Callback):
    """Tunes precision, gradient accumulation and compression while training; see the module docs.

    Args:
        config: Which knobs, toward which cost, and the guard's thresholds.
        clock: Seconds for block times.
        options: Search parameters (default :func:`job_tuner_options`).
        guard: Guard parameters (default: the thresholds in ``config``).
    """

    def __init__(self, config: TuneConfig, clock: Callable[[], float] = time.perf_counter,
                 options: TunerOptions | None = None, guard: GuardOptions | None = None) -> None:
        self.config = config
        self.names = config.job_knobs
        self.metric = parse_cost(config.cost)
        self.clock = clock
        self.options = options or job_tuner_options()
        self.guard = guard or GuardOptions(min_cosine=config.guard_cosine, loss_rise=config.guard_loss_rise)
        self.tuner: PowerTuner | None = None
        self.applied: JobSetting | None = None
        self.verdicts: dict[JobSetting, Verdict] = {}
        self.screened: dict[str, str] = {}  # what was left out before the search, and why
        self.trajectory: list[dict[str, Any]] = []
        self._space: JobSpace | None = None
        self._exact: ProbeResult | None = None
        self._waiting_for: JobSetting | None = None  # a setting whose probes are under way
        self._comm: dict[JobSetting, list[float]] = {}  # [exposed comm seconds, step seconds] per setting
        self._losses: list[float] = []  # every measured step's loss (mean over ranks), in order
        self._since_switch = 0  # steps at the setting in force since it was applied
        self._loss_checked: set[JobSetting] = set()
        self._block_start: float | None = None
        self._energy_start = 0.0
        self._steps = self._samples = 0
        self._block_losses: list[float] = []
        self._block_tail = self._block_step_s = 0.0
        self._resumed: dict[str, Any] | None = None  # a checkpoint's state, until the tuner is built
        self.resumed: str | None = None  # what a resume did to the search, for the record

    # -- start ---------------------------------------------------------------------------------------------

    def on_train_start(self, session: TunableRun) -> None:
        """Keep the first batch for probes; the tuner is built once a step has shown the batch size.

        Raises:
            ConfigError: The cost needs energy and energy is not measured.
        """
        if getattr(session, "energy", None) is None and self.metric.name != "time":
            raise ConfigError(f"--tune {self.config.knob} --cost {self.config.cost} needs energy measured: drop "
                              "--no-energy, or tune for --cost time")
        session.keep_probe_batch()

    def _build(self, session: TunableRun, first: Block) -> PowerTuner:
        """The tuner, from the first block at the starting setting: its samples per step size the accumulation
        choices, and its power stands in for the job's maximum power in Zeus's cost (what an hour costs)."""
        comm = session.comm
        in_force = _in_force(session)
        saved = self._resumed
        default = JobSetting.from_dict(saved["default"]) if saved else in_force
        precisions = self._usable_precisions(session)
        compressions: tuple[str, ...] = ("none",)
        if comm is not None:
            from dtpo.distributed.compression import COMPRESSIONS, check_compression

            usable = []
            for name in COMPRESSIONS:
                try:
                    check_compression(name, str(dist.get_backend()))
                except ConfigError as exc:
                    self.screened[f"compression {name}"] = str(exc)
                else:
                    usable.append(name)
            compressions = tuple(usable)
        elif "compression" in self.names:
            self.screened["compression"] = "needs DDP with more than one process"
        per_rank_step = first.samples // max(first.steps * session.world_size, 1)
        names = self.names
        batch_norm = _batch_norm_layer(session.model)
        if "grad-accum" in names and batch_norm and not self.config.allow_batch_change:
            self.screened["grad-accum"] = (f"the model has batch-statistics layers ({batch_norm}): their statistics "
                                           "change with the micro-batch, so accumulation is not exact; "
                                           "--allow-batch-change lets the tuner change it anyway")
            names = tuple(n for n in names if n != "grad-accum")
        self._space = JobSpace(precisions, compressions, per_rank_step, session.config.grad_accum,
                               self.config.allow_batch_change)
        context = CostContext(gpus=1, max_power_w=first.power_w)
        if not names:
            names = ("precision",)  # nothing left to search: the tuner only confirms the starting setting
            self._space = JobSpace((default.precision,), compressions, per_rank_step, session.config.grad_accum)
        if session.target_steps is not None and first.steps:  # a short job cannot spend seconds waiting
            expected_s = session.target_steps * first.time_s / first.steps
            self.options = replace(self.options, min_wait_s=min(self.options.min_wait_s, 0.05 * expected_s))
        self.tuner = PowerTuner(job_knobs(names, self._space), self.metric, context, default, self.options)
        self.applied = in_force
        if saved:
            self._resume_search(session, saved)
        return self.tuner

    def _usable_precisions(self, session: TunableRun) -> tuple[str, ...]:
        """Precisions whose matmul peak on this device is within ``screen_slowdown`` of float32's (the same
        list on every rank: each keeps a precision only if all ranks can)."""
        if "precision" not in self.names:
            return (session.precision.name,)
        from dtpo.session.loop.mfu import peak_flops

        fp32 = peak_flops(session.device, torch.float32).value
        keep = []
        for name in PRECISIONS:
            try:
                dtype = Precision(name, session.device).compute_dtype
            except ConfigError as exc:  # e.g. bf16 on a GPU older than Ampere
                self.screened[f"precision {name}"] = str(exc)
                continue
            peak = fp32 if dtype == torch.float32 else peak_flops(session.device, dtype).value
            if fp32 and peak and fp32 / peak >= self.guard.screen_slowdown:
                self.screened[f"precision {name}"] = (f"its matmul peak is {fp32 / peak:.1f}x below float32's on "
                                                      f"this device")
                continue
            keep.append(name)
        flags = torch.tensor([float(n in keep) for n in PRECISIONS], device=session.device)
        if session.ctx.distributed:
            dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        agreed = tuple(n for n, f in zip(PRECISIONS, flags.tolist(), strict=True) if f)
        for name in keep:
            if name not in agreed:
                self.screened[f"precision {name}"] = "another rank cannot run it at speed"
        return agreed or (session.precision.name,)

    # -- per step ------------------------------------------------------------------------------------------

    def _energy(self, session: TunableRun) -> float:
        energy = getattr(session, "energy", None)
        return sum(energy.monitor.snapshot().energy_j.values()) if energy is not None else 0.0

    def on_step_begin(self, session: TunableRun, step: int) -> None:
        """Open a block."""
        saved = self._resumed
        if saved and not saved["holding"] and self.tuner is None:
            default, self.applied = JobSetting.from_dict(saved["default"]), _in_force(session)
            if self.applied != default:
                self._apply(session, default)  # a search cut short starts again from the starting setting
        if self._block_start is not None or step < getattr(session, "start_step", 0) + session.config.warmup_steps:
            return
        self._energy_start = self._energy(session)
        self._block_start = self.clock()

    def on_step_end(self, session: TunableRun, step_record: StepRecord) -> None:
        """Count the step; at the end of a block agree on its figures, feed the tuner, move to its answer."""
        if self._block_start is None or step_record.warmup:
            return
        self._steps += 1
        self._samples += step_record.samples
        self._block_losses.append(step_record.loss if step_record.loss is not None else float("nan"))
        self._block_tail += step_record.tail_s or 0.0
        self._block_step_s += step_record.step_s
        tuner = self.tuner
        if self._steps < (tuner.block_steps if tuner is not None else max(self.options.wait_steps, 1)):
            return
        block, losses, tail_share = self._close_block(session)
        if tuner is None:
            tuner = self._build(session, block)
        setting = self.applied
        assert setting is not None
        comm = self._comm.setdefault(setting, [0.0, 0.0])
        comm[0] += tail_share * block.time_s
        comm[1] += block.time_s
        self._losses.extend(losses)
        self._since_switch += block.steps
        phase = tuner.phase
        knob = tuner.current_knob
        wanted = tuner.feed(block)
        self.trajectory.append({"step": step_record.step, "setting": setting.label, "phase": phase.value,
                                "steps": block.steps, "time_s": block.time_s, "energy_j": block.energy_j,
                                "samples": block.samples})
        if phase is not Phase.WAIT:
            wanted = self._check_loss(session, setting, wanted)
        if tuner.current_knob == "compression" and knob != "compression":
            wanted = self._judge_comm_share(wanted)
        self._move_to(session, wanted)

    def _close_block(self, session: TunableRun) -> tuple[Block, list[float], float]:
        """The block's figures agreed over ranks: samples and energy summed, the longest time, each step's loss
        averaged, and the exposed-communication share averaged."""
        assert self._block_start is not None
        elapsed = self.clock() - self._block_start
        energy = self._energy(session) - self._energy_start
        steps, samples, losses = self._steps, self._samples, self._block_losses
        tail_share = self._block_tail / self._block_step_s if self._block_step_s > 0 else 0.0
        self._block_start, self._steps, self._samples, self._block_losses = None, 0, 0, []
        self._block_tail = self._block_step_s = 0.0
        if session.ctx.distributed:
            world = float(session.world_size)
            sums = torch.tensor([float(samples), energy, tail_share, *losses], dtype=torch.float64,
                                device=session.device)
            longest = torch.tensor([elapsed], dtype=torch.float64, device=session.device)
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            dist.all_reduce(longest, op=dist.ReduceOp.MAX)
            values = sums.tolist()
            samples, energy, tail_share = int(values[0]), float(values[1]), values[2] / world
            losses, elapsed = [v / world for v in values[3:]], float(longest[0].item())
        return Block(steps, samples, elapsed, energy), losses, tail_share

    # -- the guard -----------------------------------------------------------------------------------------------

    def _check_loss(self, session: TunableRun, setting: JobSetting, wanted: JobSetting) -> JobSetting:
        """Reject the setting in force when its loss rose clearly above the loss it inherited."""
        tuner = self.tuner
        assert tuner is not None
        if not setting.changes_numerics and not (self.config.allow_batch_change and setting.grad_accum
                                                 != session.config.grad_accum):
            return wanted
        if setting in self._loss_checked or tuner.phase is Phase.HOLD or setting == tuner.default:
            return wanted
        n = self._since_switch
        during = self._losses[-n:]
        before = self._losses[-n - LOSS_HISTORY_STEPS:-n] if len(self._losses) > n else []
        verdict = judge_loss(before, during, self.guard)
        if verdict is None:
            return wanted
        self._loss_checked.add(setting)
        probe = self.verdicts.get(setting)
        self.verdicts[setting] = Verdict(False, verdict.reason, probe.cosine if probe else None,
                                         probe.probe_slowdown if probe else None, verdict.loss_before,
                                         verdict.loss_during)
        if session.rank == 0:
            log.warning("tune: rejected %s: %s", setting.label, verdict.reason)
        try:
            return tuner.reject(setting, verdict.reason)
        except ValueError:
            return wanted

    def _judge_comm_share(self, wanted: JobSetting) -> JobSetting:
        """As the compression knob's search starts: when communication is too small a share of the step at the
        setting chosen so far for any compression to pay, reject every compression unvisited."""
        tuner = self.tuner
        assert tuner is not None
        candidates = tuner.candidates()
        comm = self._comm.get(candidates[0].stats.setting)
        share = comm[0] / comm[1] if comm and comm[1] > 0 else None
        if share is None or share >= MIN_COMM_SHARE:
            return wanted
        reason = (f"exposed communication is {share * 100:.1f} % of step time (< {MIN_COMM_SHARE * 100:g} %): "
                  "compression can save at most that")
        self.screened["compression"] = reason
        for c in candidates[1:]:
            if c.status == "unvisited":
                wanted = tuner.reject(c.stats.setting, reason)
        return wanted

    def _needs_probe(self, setting: JobSetting) -> bool:
        return setting.changes_numerics and setting not in self.verdicts

    def _move_to(self, session: TunableRun, wanted: JobSetting) -> None:
        """Apply ``wanted``, after its probes when it changes numerics and has none yet; a setting the guard
        refuses is rejected and the tuner's next answer taken instead."""
        tuner = self.tuner
        assert tuner is not None
        while wanted != self.applied:
            if self._needs_probe(wanted):
                self._request_probes(session, wanted)
                return
            verdict = self.verdicts.get(wanted)
            if verdict is not None and not verdict.accepted:
                wanted = tuner.reject(wanted, verdict.reason)
                continue
            self._apply(session, wanted)
            return

    def _request_probes(self, session: TunableRun, setting: JobSetting) -> None:
        """Probe ``setting`` and every other unjudged candidate of the current knob that changes numerics,
        after one exact probe: all at the same weights, on the same batch. The verdicts come with the last."""
        tuner = self.tuner
        assert tuner is not None
        others = [c.stats.setting for c in tuner.candidates() if c.status == "unvisited"]
        batch = [setting, *(s for s in others if s != setting and self._needs_probe(s))]
        self._waiting_for = setting
        session.request_probe(ProbeRequest(*EXACT, passes=1, done=self._exact_done))
        for i, candidate in enumerate(batch):
            passes = self.guard.feedback_passes if candidate.compression == "powersgd" else 1
            last = i == len(batch) - 1
            session.request_probe(ProbeRequest(
                candidate.precision, candidate.compression, candidate.powersgd_rank, passes=passes,
                done=lambda result, c=candidate, last=last: self._probe_done(session, c, result, last)))

    def _exact_done(self, result: ProbeResult) -> None:
        self._exact = result

    def _probe_done(self, session: TunableRun, setting: JobSetting, result: ProbeResult, last: bool) -> None:
        """Judge one probed candidate against the exact probe of the same round; after the round's last, move
        on to the setting the tuner asked for (or its next choice, if the guard refused it)."""
        assert self._exact is not None
        sharded = session.ctx.distributed and session.config.strategy == "fsdp"
        cosine = cosine_similarity(result.gradient, self._exact.gradient, sharded=sharded)
        slowdown = torch.tensor([result.seconds / self._exact.seconds if self._exact.seconds > 0 else 1.0],
                                dtype=torch.float64, device=session.device)
        if session.ctx.distributed:  # ranks time their own passes: agree on the slowest
            dist.all_reduce(slowdown, op=dist.ReduceOp.MAX)
        verdict = judge_probe(cosine, result.finite, float(slowdown.item()), self.guard)
        self.verdicts[setting] = verdict
        if session.rank == 0:
            log.info("tune: guard %s %s: %s", "accepted" if verdict.accepted else "rejected", setting.label,
                     verdict.reason)
        if last:
            wanted, self._waiting_for = self._waiting_for, None
            self._exact = None  # the weights move on: the next round probes the exact gradient again
            assert wanted is not None
            self._move_to(session, wanted)

    # -- applying ------------------------------------------------------------------------------------------------

    def _apply(self, session: TunableRun, setting: JobSetting) -> None:
        current = self.applied
        if current is None or setting.precision != current.precision:
            session.set_precision(setting.precision)
        if current is None or setting.grad_accum != current.grad_accum:
            session.set_grad_accum(setting.grad_accum, keep_global_batch=not self.config.allow_batch_change)
        if current is None or (setting.compression, setting.powersgd_rank) != (current.compression,
                                                                               current.powersgd_rank):
            session.set_compression(setting.compression, setting.powersgd_rank)
        self.applied = setting
        self._since_switch = 0

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (:mod:`dtpo.session.checkpoint`): the starting setting, the guard's verdicts and
        the trajectory; once the search holds a choice, also the measured settings, so a resumed run holds the
        same choice at once instead of profiling (and probing) again."""
        tuner = self.tuner
        if tuner is None:
            return {"default": None}
        holding = tuner.holding
        return {"default": tuner.default.as_dict(), "holding": holding,
                "settings": [st.as_row() for st in tuner.stats.values() if st.measured] if holding else None,
                "choice": tuner.choice.as_dict() if holding and tuner.choice is not None else None,
                "verdicts": [[setting.as_dict(), verdict.as_dict()] for setting, verdict in self.verdicts.items()],
                "comm": [[setting.as_dict(), list(c)] for setting, c in self._comm.items()],
                "screened": dict(self.screened), "trajectory": list(self.trajectory)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a checkpoint's state; the search resumes once the first block has measured the job again (the
        tuner is built then): holding the saved choice, or searching again from the saved starting setting."""
        if state.get("default") is None:
            return
        self._resumed = state
        self.verdicts = {JobSetting.from_dict(s): Verdict(**v) for s, v in state["verdicts"]}
        self._comm = {JobSetting.from_dict(s): list(c) for s, c in state["comm"]}
        self.screened = dict(state["screened"])
        self.trajectory = list(state["trajectory"])

    def _resume_search(self, session: TunableRun, saved: dict[str, Any]) -> None:
        tuner = self.tuner
        assert tuner is not None
        self._resumed = None
        if not saved["holding"]:
            self.resumed = "the search was cut short by the restart: it started again from the starting setting"
            return
        measured = {st.setting: st for st in (SettingStats.from_row(row, JobSetting) for row in saved["settings"])}
        held = saved.get("choice")
        choice = tuner.start_from_profile(measured, JobSetting.from_dict(held) if held else None)
        self.resumed = f"held the checkpoint's choice ({choice.label}) without profiling again"
        if choice != self.applied:
            self._apply(session, choice)

    # -- end -----------------------------------------------------------------------------------------------------

    def tuner_state(self) -> TunerState:
        """``wait`` before the first measured step, else the phase and the knob being searched."""
        tuner = self.tuner
        if tuner is None:
            return TunerState("job", "wait")
        knob = tuner.current_knob
        return TunerState("job", f"{tuner.phase.value}:{knob}" if knob else tuner.phase.value)

    def clock_lock(self) -> None:
        """Job knobs leave the SM clock alone."""
        return None

    def on_rank_end(self, session: TunableRun, rank_record: RankRecord) -> None:
        """Put what was tried, what the guard said and the choice in this rank's record."""
        section = JobTuning(self.config.knob, self.metric.name, screened=dict(self.screened))
        if self.tuner is None:
            rank_record.tuning = replace(section, note="training ended before the tuner had measured a step")
            return
        report = self.tuner.report()
        for row in report["settings"]:
            setting = JobSetting.from_dict(row)
            comm = self._comm.get(setting)
            row["comm_share"] = comm[0] / comm[1] if comm and comm[1] > 0 else None
            row["samples_per_s"] = 1.0 / row["time_per_sample_s"] if row["time_per_sample_s"] > 0 else None
            verdict = self.verdicts.get(setting)
            row["guard"] = verdict.as_dict() if verdict is not None else None
        measured = {JobSetting.from_dict(r) for r in report["settings"]}
        report["rejected"] = [{**s.as_dict(), "label": s.label, **v.as_dict()}
                              for s, v in self.verdicts.items() if not v.accepted and s not in measured]
        report["guard_options"] = {"min_cosine": self.guard.min_cosine, "loss_rise": self.guard.loss_rise,
                                   "feedback_passes": self.guard.feedback_passes}
        report["allow_batch_change"] = self.config.allow_batch_change
        report["trajectory"] = self.trajectory
        if self.resumed is not None:
            report["resumed"] = self.resumed
        rank_record.tuning = replace(section, report=report)


def _in_force(session: TunableRun) -> JobSetting:
    """The Session's precision, accumulation and compression now."""
    comm = session.comm
    return JobSetting(session.precision.name, session.grad_accum, comm.compression if comm is not None else "none",
                      comm.powersgd_rank if comm is not None else 1)
