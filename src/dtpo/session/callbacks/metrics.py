"""``--metrics-addr``: live Prometheus metrics of a training run, as a Session callback.

Every rank writes its figures into the node's metrics folder (:class:`~dtpo.telemetry.metrics.RankMetrics`);
local rank 0 serves the folder at the address (:class:`~dtpo.telemetry.metrics_server.MetricsServer`) from
the start of training until the run's record is written. The metrics are listed in
:mod:`dtpo.telemetry.metrics`.

Per optimizer step the callback writes three values (step time, steps, samples) and adds the step's parts to
sums kept in Python; everything else is written once per window: throughput, the shares of the step, sync
wait, energy and power per device, and, for NVIDIA GPUs, their power, clock and limit read through NVML under
dcgm-exporter's names, with the knobs in force and the tuners' states. Tuners and knob holders are found by what
they implement (:class:`~dtpo.core.tuner_status.TunerStatus`, :class:`~dtpo.core.tuner_status.SlackStatus`),
not by their class; so is the rebalancer, whose ``current_shares()`` gives this rank's share of the global batch
(``dtpo_batch_share``). It comes after the energy callback and the tuners, so a window's energy and the tuners'
decisions are in. Metrics never stop training: a failure
logs one warning and the run goes on without them.
"""

from __future__ import annotations

import logging
from typing import Any

from dtpo.core.callbacks import Callback
from dtpo.core.config import parse_metrics_addr
from dtpo.core.record import RunRecord, StepRecord
from dtpo.core.steps import RunView, Window
from dtpo.core.tuner_status import SlackStatus, TunerStatus
from dtpo.devices.base import Device, DeviceError
from dtpo.telemetry.metrics import RankMetrics
from dtpo.telemetry.metrics_server import MetricsServer, bind_error, metrics_dir, prepare_metrics_dir

log = logging.getLogger(__name__)

PARTS = ("data_wait", "compute", "optimizer", "tail")


class MetricsCallback(Callback):
    """Writes this rank's live metrics; on local rank 0, also serves the node's. See the module docs.

    Args:
        addr: ``--metrics-addr``: ``[HOST:]PORT`` local rank 0 serves at (port 0: a free one).

    Attributes:
        metrics: This rank's metrics (``None`` before training starts or after a failure).
        server: The node's endpoint on local rank 0 while it serves, else ``None``.
    """

    live_step_end = False  # the records feed the window's sums: they may come as the window closes

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.metrics: RankMetrics | None = None
        self.server: MetricsServer | None = None
        self._sums = dict.fromkeys(("step", *PARTS), 0.0)
        self._tail_steps = self._steps = 0
        self._devices: dict[str, Device] = {}
        self._gpus: list[Device] = []
        self._slack: SlackStatus | None = None
        self._slack_index = -1

    # -- start ---------------------------------------------------------------------------------------------

    def on_train_start(self, session: RunView) -> None:
        """Open this rank's metrics; local rank 0 prepares the node's folder and starts serving it."""
        try:
            self._start(session)
        except Exception as exc:  # metrics must never stop training
            self._fail("cannot start", exc)

    def _start(self, session: Any) -> None:
        ctx = session.ctx
        directory = metrics_dir(session.run_dir, ctx.node)
        attempt = int(getattr(session.record, "attempt", 0) or 0)
        if ctx.local_rank == 0:
            prepare_metrics_dir(directory, keep_counters=attempt > 0)
        metrics = self.metrics = RankMetrics(directory, session.rank, ctx.node, session.record.run_id)
        config = session.run_config
        workload = config.workload.name if config.workload.steps is not None else "script"  # dtpo train fills steps
        metrics.set("dtpo_run_info", 1, workload, str(session.world_size), session.config.strategy, str(attempt))
        if session.energy is not None:
            self._devices = {d.info.name: d for d in session.energy.discovery.devices}
            metrics.set("dtpo_estimated", float(session.energy.discovery.estimated))
        self._gpus = _nvml_gpus(session)
        self._slack = next((cb for cb in session.callbacks if isinstance(cb, SlackStatus)), None)
        self._settings(session, {name: switch.value for name, switch in session.switches.items()})
        self._tuners(session)
        if ctx.local_rank == 0:
            self._serve(directory)

    def _serve(self, directory: Any) -> None:
        host, port = parse_metrics_addr(self.addr)
        server = MetricsServer(directory)
        try:
            url = server.start(host, port)
        except OSError as exc:
            log.warning("metrics: %s; training goes on without the endpoint",
                        bind_error(f"--metrics-addr {self.addr}", host, exc))
            return
        self.server = server
        log.info("metrics: serving %s", url)

    # -- per step, per window ------------------------------------------------------------------------------

    def on_step_end(self, session: RunView, step_record: StepRecord) -> None:
        """Step time and counts; the step's parts go into the window's sums."""
        metrics = self.metrics
        if metrics is None:
            return
        try:
            metrics.step(step_record.step_s, step_record.samples)
            if step_record.warmup:
                return
            sums = self._sums
            sums["step"] += step_record.step_s
            sums["data_wait"] += step_record.data_wait_s
            sums["compute"] += step_record.compute_s
            sums["optimizer"] += step_record.optimizer_s
            if step_record.tail_s is not None:
                sums["tail"] += step_record.tail_s
                self._tail_steps += 1
            self._steps += 1
        except Exception as exc:
            self._fail("step update failed", exc)

    def on_window_end(self, session: RunView, window: Window) -> None:
        """Everything measured once a window: throughput, shares, sync wait, energy, GPUs, knobs, tuners."""
        if self.metrics is None:
            return
        try:
            self._window(session, window, self.metrics)
        except Exception as exc:
            self._fail("window update failed", exc)

    def _window(self, session: Any, window: Window, metrics: RankMetrics) -> None:
        metrics.set("dtpo_throughput_samples_per_second", window.throughput)
        sums, steps, tail_steps = self._sums, self._steps, self._tail_steps
        self._sums, self._steps, self._tail_steps = dict.fromkeys(sums, 0.0), 0, 0
        if sums["step"] > 0:
            for part in PARTS:
                if part != "tail" or (tail_steps and tail_steps == steps):
                    metrics.set("dtpo_step_share", sums[part] / sums["step"], part)
        latest = self._slack.latest_slack() if self._slack is not None else None
        if latest is not None:
            if latest.window != self._slack_index and session.rank < len(latest.wait_s):
                self._slack_index = latest.window
                metrics.set("dtpo_sync_wait_seconds", latest.wait_s[session.rank], "slack")
        elif tail_steps:
            metrics.set("dtpo_sync_wait_seconds", sums["tail"] / tail_steps, "tail")
        if window.energy_j:
            self._energy(session, window, metrics)
        self._gpu_readings(metrics)
        self._settings(session, window.settings)
        self._tuners(session)

    def _energy(self, session: Any, window: Window, metrics: RankMetrics) -> None:
        measured = session.energy.windows[-1] if session.energy is not None and session.energy.windows else {}
        time_s = float(measured.get("time_s") or window.time_s)
        for name, joules in window.energy_j.items():
            device = self._devices.get(name)
            kind = device.info.kind if device is not None else "unknown"
            source = window.sources.get(name) or (device.info.source if device is not None else "unknown")
            if time_s > 0:
                metrics.set("dtpo_device_power_watts", joules / time_s, name, kind, source)
            metrics.inc("dtpo_device_energy_joules_total", joules, name, kind, source)
        per_sample = window.joules_per_sample
        if per_sample is not None:
            metrics.set("dtpo_energy_per_sample_joules", per_sample)
        metrics.set("dtpo_estimated", float(window.estimated))

    def _gpu_readings(self, metrics: RankMetrics) -> None:
        """NVML's power, energy counter, SM clock and power limit of this rank's GPUs (a few NVML calls each)."""
        for gpu in self._gpus:
            try:
                limit = None
                try:
                    limit = gpu.knob_state().power_limit_w
                except DeviceError:
                    pass
                counter_mj = getattr(gpu, "_last_mj", None) if gpu.info.source == "nvml-counter" else None
                energy_mj = float(counter_mj) if counter_mj is not None else gpu.energy_j() * 1000.0
                model = gpu.info.name.split("(", 1)[-1].rstrip(")")
                metrics.gpu(int(getattr(gpu, "index", 0)), str(getattr(gpu, "uuid", "")), model, gpu.power_w(),
                            energy_mj, gpu.sm_clock_mhz(), limit)
                if limit is not None and gpu is self._gpus[0]:
                    metrics.set("dtpo_knob_setting", limit, "power_limit_w")
            except DeviceError as exc:
                log.debug("metrics: %s unreadable: %s", gpu.info.name, exc)

    # -- knobs and tuners ----------------------------------------------------------------------------------

    def _settings(self, session: Any, settings: dict[str, Any]) -> None:
        metrics = self.metrics
        assert metrics is not None
        for name, value in settings.items():
            if name in ("precision", "compression"):
                metrics.choose("dtpo_knob_choice", (name,), (str(value),))
            elif isinstance(value, int | float) and not isinstance(value, bool):
                metrics.set("dtpo_knob_setting", float(value), name)
        lock = _locked_sm_clock(session.callbacks)
        if lock is not None:
            metrics.set("dtpo_knob_setting", lock, "sm_clock_mhz")

    def _tuners(self, session: Any) -> None:
        metrics = self.metrics
        assert metrics is not None
        found = False
        for callback in _tuners(session.callbacks):
            state = callback.tuner_state()
            if state is not None:
                found = True
                metrics.choose("dtpo_tuner_state", (state.tuner,), (state.state,))
        if not found:
            metrics.choose("dtpo_tuner_state", ("none",), ("off",))
        share = _batch_share(session.callbacks, session.rank)
        if share is not None:
            metrics.set("dtpo_batch_share", share)

    # -- end -----------------------------------------------------------------------------------------------

    def on_train_end(self, session: RunView, record: RunRecord | None) -> None:
        """After the record is written: stop serving (local rank 0) and close this rank's metric files."""
        self.close()

    def close(self) -> None:
        """Stop the endpoint and close the metric files (idempotent)."""
        server, self.server = self.server, None
        if server is not None:
            try:
                server.stop()
            except Exception as exc:
                log.warning("metrics: cannot stop the endpoint cleanly: %s", exc)
        metrics, self.metrics = self.metrics, None
        if metrics is not None:
            metrics.close()

    def _fail(self, what: str, exc: BaseException) -> None:
        log.warning("metrics: %s (%s: %s); training goes on without live metrics", what, type(exc).__name__, exc)
        self.close()


def _nvml_gpus(session: Any) -> list[Device]:
    """This rank's NVIDIA GPUs: those energy measurement opened, else those the knob callbacks hold."""
    from dtpo.devices.nvml import NvmlGpu

    candidates: list[Device] = list(session.energy.discovery.devices) if session.energy is not None else []
    for callback in session.callbacks:
        candidates += list(getattr(callback, "gpus", None) or [])
    gpus: list[Device] = []
    for device in candidates:
        if isinstance(device, NvmlGpu) and all(device is not g for g in gpus):
            gpus.append(device)
    return gpus


def _tuners(callbacks: list[Any]) -> list[TunerStatus]:
    """The callbacks that hold or tune knobs, in the Session's order."""
    return [callback for callback in callbacks if isinstance(callback, TunerStatus)]


def _batch_share(callbacks: list[Any], rank: int) -> float | None:
    """This rank's samples per step from the first callback whose ``current_shares()`` has every rank's share of
    the global batch (the rebalancer, from its first window on), or ``None``."""
    for callback in callbacks:
        current = getattr(callback, "current_shares", None)
        shares = current() if callable(current) else None
        if shares is not None and 0 <= rank < len(shares):
            return float(shares[rank])
    return None


def _locked_sm_clock(callbacks: list[Any]) -> float | None:
    """The SM clock the first knob callback or tuner with a say on it locked and applied (0: clocks float again),
    or ``None``."""
    for callback in _tuners(callbacks):
        lock = callback.clock_lock()
        if lock is not None:
            return lock.mhz
    return None
