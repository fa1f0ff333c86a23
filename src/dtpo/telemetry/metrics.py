"""Live Prometheus metrics of a training run: what every rank writes, one endpoint per node serves.

Every rank writes its figures with prometheus-client's multiprocess mode into the node's metrics folder
(``RUN_DIR/metrics/<hostname>/``, memory-mapped files, no syscall per update); local rank 0 serves them all
at ``--metrics-addr`` (:mod:`dtpo.telemetry.metrics_server`). Every series carries ``rank``, ``Hostname`` and
``run_id``. GPU figures use dcgm-exporter's names and labels (``gpu``, ``UUID``, ``device``, ``modelName``,
``Hostname``), so panels built for dcgm-exporter work on them too.

================================================  =========  ===================================================
Metric                                            Type       Meaning (extra labels)
================================================  =========  ===================================================
``DCGM_FI_DEV_POWER_USAGE``                       gauge      GPU power now, W (NVML's reading, once a window)
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``          gauge      GPU energy counter, mJ since the driver loaded
                                                             (since dtpo opened the GPU where it has no counter)
``DCGM_FI_DEV_SM_CLOCK``                          gauge      GPU SM clock now, MHz
``DCGM_FI_DEV_POWER_MGMT_LIMIT``                  gauge      GPU power limit in force, W
``dtpo_run_info``                                 gauge      1; the run's settings as labels (``workload``,
                                                             ``world_size``, ``strategy``, ``attempt``)
``dtpo_step_seconds``                             gauge      wall time of the latest optimizer step, s
``dtpo_steps_total``                              counter    optimizer steps (warm-up included)
``dtpo_samples_total``                            counter    samples this rank processed (warm-up included)
``dtpo_throughput_samples_per_second``            gauge      this rank's samples / s over the latest window
``dtpo_step_share``                               gauge      share of step time over the latest window
                                                             (``part``: data_wait, compute, tail, optimizer;
                                                             the tail is exposed communication + sync wait)
``dtpo_sync_wait_seconds``                        gauge      mean wait per step over the latest window
                                                             (``basis="slack"``: wait for the slowest rank, from
                                                             the online slack tracker; ``basis="tail"``: the
                                                             communication tail, an upper bound of it)
``dtpo_energy_per_sample_joules``                 gauge      this rank's devices' J / sample, latest window
``dtpo_device_power_watts``                       gauge      mean power over the latest window (``device``,
                                                             ``kind``: gpu/cpu/dram, ``source``: nvml-counter,
                                                             nvml-polled, rapl, modelled, simulated)
``dtpo_device_energy_joules_total``               counter    energy over the measured steps (same labels)
``dtpo_estimated``                                gauge      1 when any of this rank's devices is modelled
``dtpo_knob_setting``                             gauge      a numeric knob in force (``knob``: grad_accum,
                                                             power_limit_w, sm_clock_mhz)
``dtpo_knob_choice``                              gauge      1 for the setting in force, 0 for earlier ones
                                                             (``knob``: precision, compression; ``value``)
``dtpo_tuner_state``                              gauge      1 for a tuner's state now, 0 for earlier states
                                                             (``tuner``: none, power, job, stragglers,
                                                             rebalance; ``state``)
``dtpo_batch_share``                              gauge      this rank's samples per step now, its share of the
                                                             global batch (``--tune rebalance`` only, from its
                                                             first window on)
================================================  =========  ===================================================

Devices shared by a node (CPU packages, DRAM) are counted by local rank 0 only, so sums over ranks count them
once. Throughput per watt and fleet J / sample are PromQL over these (see :mod:`dtpo.telemetry.dashboard`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtpo.telemetry.metrics_server import check_metrics_addr

__all__ = ["METRICS", "MetricSpec", "RankMetrics", "check_metrics_addr", "exposed_names"]

RANK_LABELS = ("rank", "Hostname", "run_id")
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "rank", "run_id")
FILE_TAG = "dtpo-"
"""dtpo's metric files are ``<type>_dtpo-<pid>.db``: they never collide with files the application's own
prometheus-client writes, even in the same process and folder."""


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric.

    Attributes:
        name: Its name as scraped (counters end in ``_total``).
        kind: ``"gauge"`` or ``"counter"``.
        help: The HELP text.
        labels: Label names, in order.
    """

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = RANK_LABELS


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", DCGM_LABELS),
    MetricSpec("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "gauge", "Total energy consumption since boot (in mJ).",
               DCGM_LABELS),
    MetricSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", DCGM_LABELS),
    MetricSpec("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).", DCGM_LABELS),
    MetricSpec("dtpo_run_info", "gauge", "1, with the run's settings as labels.",
               (*RANK_LABELS, "workload", "world_size", "strategy", "attempt")),
    MetricSpec("dtpo_step_seconds", "gauge", "Wall time of the latest optimizer step (s)."),
    MetricSpec("dtpo_steps_total", "counter", "Optimizer steps, warm-up included."),
    MetricSpec("dtpo_samples_total", "counter", "Samples this rank processed, warm-up included."),
    MetricSpec("dtpo_throughput_samples_per_second", "gauge", "This rank's samples per second, latest window."),
    MetricSpec("dtpo_step_share", "gauge", "Share of step time per part (data_wait, compute, tail = exposed "
               "communication + sync wait, optimizer), latest window.", (*RANK_LABELS, "part")),
    MetricSpec("dtpo_sync_wait_seconds", "gauge", "Mean wait per step, latest window: basis=slack is the wait for "
               "the slowest rank (online slack tracker), basis=tail the communication tail (an upper bound).",
               (*RANK_LABELS, "basis")),
    MetricSpec("dtpo_energy_per_sample_joules", "gauge", "Joules per sample of this rank's devices, latest window."),
    MetricSpec("dtpo_device_power_watts", "gauge", "Mean power per device over the latest window (W).",
               (*RANK_LABELS, "device", "kind", "source")),
    MetricSpec("dtpo_device_energy_joules_total", "counter", "Energy per device over the measured steps (J).",
               (*RANK_LABELS, "device", "kind", "source")),
    MetricSpec("dtpo_estimated", "gauge", "1 when any of this rank's devices' energy is modelled."),
    MetricSpec("dtpo_knob_setting", "gauge", "Numeric knob in force (grad_accum, power_limit_w, sm_clock_mhz).",
               (*RANK_LABELS, "knob")),
    MetricSpec("dtpo_knob_choice", "gauge", "1 for the setting in force (precision, compression), 0 for earlier.",
               (*RANK_LABELS, "knob", "value")),
    MetricSpec("dtpo_tuner_state", "gauge", "1 for a tuner's state now, 0 for its earlier states.",
               (*RANK_LABELS, "tuner", "state")),
    MetricSpec("dtpo_batch_share", "gauge", "This rank's samples per step now: its share of the global batch "
               "(--tune rebalance)."),
)

SPECS = {spec.name: spec for spec in METRICS}


def exposed_names() -> set[str]:
    """Every metric name a scrape of a dtpo endpoint can show."""
    return set(SPECS)


def _value_class() -> Any:
    """A multiprocess value class of dtpo's own (files ``*_dtpo-<pid>.db`` in ``$PROMETHEUS_MULTIPROC_DIR``).

    prometheus-client picks its global value class when it is first imported; dtpo does not depend on that
    order: its metrics always write to the metrics folder, and the application's own metrics are untouched.
    """
    from prometheus_client import values

    return values.MultiProcessValue(lambda: f"{FILE_TAG}{os.getpid()}")


class RankMetrics:
    """The metrics one rank writes into the node's metrics folder; series are bound once and cached, so an
    update is one memory-mapped write.

    Args:
        directory: The node's metrics folder (made if missing; ``PROMETHEUS_MULTIPROC_DIR`` is set to it).
        rank: Global rank.
        hostname: This node's host name.
        run_id: The run's id.
    """

    def __init__(self, directory: Path, rank: int, hostname: str, run_id: str) -> None:
        from prometheus_client import Counter, Gauge, values

        directory.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)  # where the value class opens its files
        self.directory = directory
        self._base = (str(rank), hostname, run_id)
        self._values = _value_class()
        self._closed = False
        global_class = values.ValueClass
        values.ValueClass = self._values  # metrics and their children take the value class when they are made
        try:
            self._families = {spec.name: (Gauge if spec.kind == "gauge" else Counter)(
                spec.name, spec.help, spec.labels, registry=None,
                **({"multiprocess_mode": "mostrecent"} if spec.kind == "gauge" else {})) for spec in METRICS}
        finally:
            values.ValueClass = global_class
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._chosen: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}
        self.step_s = self.series("dtpo_step_seconds")
        self.steps = self.series("dtpo_steps_total")
        self.samples = self.series("dtpo_samples_total")

    def series(self, name: str, *extra: str, dcgm: tuple[str, ...] = ()) -> Any:
        """The child of metric ``name`` for this rank and the ``extra`` label values (cached).

        Args:
            name: A metric of :data:`METRICS`.
            extra: Values of its labels after ``rank``, ``Hostname``, ``run_id``.
            dcgm: For DCGM metrics: the values of ``gpu``, ``UUID``, ``device``, ``modelName``.
        """
        key = (name, dcgm + extra)
        child = self._children.get(key)
        if child is None:
            from prometheus_client import values

            hostname_rank_run = (self._base[1], self._base[0], self._base[2])
            labels = (*dcgm, *hostname_rank_run) if dcgm else (*self._base, *extra)
            global_class = values.ValueClass
            values.ValueClass = self._values
            try:
                child = self._children[key] = self._families[name].labels(*labels)
            finally:
                values.ValueClass = global_class
        return child

    def step(self, step_s: float, samples: int) -> None:
        """One optimizer step: its time, and one more step and ``samples`` more samples."""
        if not self._closed:
            self.step_s.set(step_s)
            self.steps.inc(1)
            if samples > 0:
                self.samples.inc(samples)

    def set(self, name: str, value: float, *extra: str) -> None:
        """Set gauge ``name`` of this rank (with the ``extra`` label values) to ``value``."""
        if not self._closed:
            self.series(name, *extra).set(value)

    def inc(self, name: str, amount: float, *extra: str) -> None:
        """Add ``amount`` to counter ``name`` of this rank."""
        if not self._closed and amount > 0:
            self.series(name, *extra).inc(amount)

    def choose(self, name: str, key: tuple[str, ...], value: tuple[str, ...]) -> None:
        """One-hot gauge: the series ``key + value`` goes to 1, the one chosen before under ``key`` to 0 (series
        cannot be removed in multiprocess mode, so earlier choices stay at 0)."""
        if self._closed:
            return
        previous = self._chosen.get((name, key))
        if previous == value:
            return
        if previous is not None:
            self.series(name, *key, *previous).set(0)
        self.series(name, *key, *value).set(1)
        self._chosen[(name, key)] = value

    def gpu(self, index: int, uuid: str, model: str, power_w: float | None, energy_mj: float | None,
            sm_clock_mhz: float | None, power_limit_w: float | None) -> None:
        """One GPU's figures under dcgm-exporter's names (a ``None`` is not exported)."""
        if self._closed:
            return
        dcgm = (str(index), uuid, f"nvidia{index}", model)
        for name, value in (("DCGM_FI_DEV_POWER_USAGE", power_w), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", energy_mj),
                            ("DCGM_FI_DEV_SM_CLOCK", sm_clock_mhz), ("DCGM_FI_DEV_POWER_MGMT_LIMIT", power_limit_w)):
            if value is not None:
                self.series(name, dcgm=dcgm).set(value)

    def close(self) -> None:
        """Stop writing and close this process's metric files (what they hold stays readable). Idempotent."""
        if not self._closed:
            self._closed = True
            self._values.close_all_files()
