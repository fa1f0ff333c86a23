"""Measured GPU power-limit traces (Zeus, NSDI '23) shipped with dtpo.

Each trace is one training workload (network, dataset, batch size, optimizer) measured on one real GPU at
every power limit from 100 W to the GPU's maximum in 25 W steps: seconds per epoch and average board power.
The CSV files are verbatim copies of the Zeus artifact (Apache-2.0, attribution in
``dtpo/devices/physics/data/zeus_nsdi23/README.md``) and are read with :mod:`importlib.resources`, so they work from a
wheel, an editable install or a source checkout alike.

Optimizer rule: the V100 file measures shufflenetv2/CIFAR-100 with two optimizers (adadelta and adam). By
default dtpo keeps, for every workload, only the optimizer Zeus itself uses for it (its ``run_alibaba.py``
job defaults: adadelta for shufflenetv2 and resnet50, adamw for bert and deepspeech2, adam for ncf). Pass
``all_optimizers=True`` to :func:`load_traces` for every row.

Default batch size (:func:`find_trace` with ``batch_size=None``): Zeus's default batch size of that
workload, capped at the largest batch measured on that GPU (again ``run_alibaba.py``: cifar100 1024,
imagenet 256, squad 32, librispeech 256, movielens-1m 1024, sentiment140 128), rounded down to a measured
batch size.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

from dtpo.core.errors import ConfigError

DATA_PACKAGE = "dtpo.devices.physics"
DATA_DIR = ("data", "zeus_nsdi23")
TRACE_FILES: dict[str, str] = {"A40": "summary_power_a40.csv", "V100": "summary_power_v100.csv"}

# Zeus's own optimizer and default batch size per (network, dataset), from its run_alibaba.py.
ZEUS_OPTIMIZER: dict[tuple[str, str], str] = {
    ("shufflenetv2", "cifar100"): "adadelta",
    ("resnet50", "imagenet"): "adadelta",
    ("bert_base_uncased", "squad"): "adamw",
    ("deepspeech2", "librispeech"): "adamw",
    ("ncf", "movielens-1m"): "adam",
    ("bert_base_uncased", "sentiment140"): "adamw",
}
ZEUS_DEFAULT_BATCH: dict[tuple[str, str], int] = {
    ("shufflenetv2", "cifar100"): 1024,
    ("resnet50", "imagenet"): 256,
    ("bert_base_uncased", "squad"): 32,
    ("deepspeech2", "librispeech"): 256,
    ("ncf", "movielens-1m"): 1024,
    ("bert_base_uncased", "sentiment140"): 128,
}


@dataclass(frozen=True)
class TracePoint:
    """One measurement: a power limit and what the GPU did under it.

    Attributes:
        power_limit_w: The power limit set (W).
        time_per_epoch_s: Seconds for one training epoch.
        average_power_w: Mean board power over the epoch (W).
    """

    power_limit_w: float
    time_per_epoch_s: float
    average_power_w: float

    @property
    def energy_per_epoch_j(self) -> float:
        """Joules for one epoch: time times average power."""
        return self.time_per_epoch_s * self.average_power_w


@dataclass(frozen=True)
class Trace:
    """A workload measured at every power limit on one GPU.

    Attributes:
        gpu: Canonical GPU name: ``"A40"`` or ``"V100"`` for the shipped traces; any GPU with a power spec
            (:mod:`dtpo.devices.physics.power_specs`) for a user's own trace.
        network: e.g. ``"resnet50"``.
        dataset: e.g. ``"imagenet"``.
        batch_size: Samples per step.
        optimizer: e.g. ``"adadelta"``.
        points: Measurements, ascending by power limit.
        samples_per_epoch: Training samples in one epoch, when the trace says so; ``None`` (the shipped traces)
            means the known size of ``dataset`` (:data:`dtpo.devices.physics.gpu_model.DATASET_SAMPLES`).
        source: Where the trace comes from: ``None`` for the shipped Zeus traces, else the user's file
            (see :mod:`dtpo.devices.physics.user_trace`).
    """

    gpu: str
    network: str
    dataset: str
    batch_size: int
    optimizer: str
    points: tuple[TracePoint, ...]
    samples_per_epoch: int | None = None
    source: str | None = None

    @property
    def workload(self) -> str:
        """``"network/dataset"``, the canonical workload name."""
        return f"{self.network}/{self.dataset}"

    @property
    def power_limits_w(self) -> tuple[float, ...]:
        """The measured power limits, ascending."""
        return tuple(p.power_limit_w for p in self.points)

    @property
    def energy_per_epoch_j(self) -> tuple[float, ...]:
        """Joules per epoch at each measured limit (time x average power)."""
        return tuple(p.energy_per_epoch_j for p in self.points)

    @property
    def optimal_power_limit_w(self) -> float:
        """The measured limit with the least energy per epoch (the lowest such limit on a tie)."""
        energies = self.energy_per_epoch_j
        return self.points[energies.index(min(energies))].power_limit_w

    @property
    def label(self) -> str:
        """Short readable identity, e.g. ``"A40 resnet50/imagenet b128 adadelta"``."""
        return f"{self.gpu} {self.workload} b{self.batch_size} {self.optimizer}"


def _read_csv(gpu: str) -> list[dict[str, str]]:
    """Rows of the packaged CSV of ``gpu`` (``"A40"`` or ``"V100"``)."""
    node = resources.files(DATA_PACKAGE)
    for part in (*DATA_DIR, TRACE_FILES[gpu]):
        node = node / part
    return list(csv.DictReader(io.StringIO(node.read_text(encoding="utf-8"))))


def trace_csv_rows(gpu: str) -> list[dict[str, str]]:
    """The raw rows of a GPU's packaged trace file (strings, as in the CSV), for checks and tools."""
    return _read_csv(_trace_gpu(gpu))


@cache
def _load(gpu: str, all_optimizers: bool) -> tuple[Trace, ...]:
    groups: dict[tuple[str, str, int, str], list[TracePoint]] = {}
    for row in _read_csv(gpu):
        network, dataset, optimizer = row["network"], row["dataset"], row["optimizer"].lower()
        if not all_optimizers and ZEUS_OPTIMIZER.get((network, dataset), optimizer) != optimizer:
            continue
        key = (network, dataset, int(row["batch_size"]), optimizer)
        groups.setdefault(key, []).append(TracePoint(
            float(row["power_limit"]), float(row["time_per_epoch"]), float(row["average_power"])))
    return tuple(
        Trace(gpu, network, dataset, batch, optimizer, tuple(sorted(points, key=lambda p: p.power_limit_w)))
        for (network, dataset, batch, optimizer), points in sorted(groups.items()))


def traced_gpus() -> list[str]:
    """GPUs with measured traces."""
    return list(TRACE_FILES)


def _trace_gpu(gpu: str) -> str:
    key = gpu.strip().upper()
    if key.startswith("V100"):
        key = "V100"
    if key not in TRACE_FILES:
        raise ConfigError(f"no measured traces for GPU {gpu!r}; traced GPUs: {', '.join(TRACE_FILES)}")
    return key


def load_traces(gpu: str | None = None, all_optimizers: bool = False) -> list[Trace]:
    """Every trace of one GPU (``"A40"``/``"V100"``), or of both with ``gpu=None`` (cached after the first call).

    Args:
        gpu: Which GPU's traces; ``None`` for all.
        all_optimizers: Keep every optimizer, not only Zeus's own one per workload (see the module docs).
    """
    gpus = traced_gpus() if gpu is None else [_trace_gpu(gpu)]
    return [trace for g in gpus for trace in _load(g, all_optimizers)]


def known_trace_workloads(gpu: str | None = None) -> list[str]:
    """Canonical ``network/dataset`` names of the traced workloads, sorted."""
    return sorted({trace.workload for trace in load_traces(gpu)})


def resolve_workload(workload: str) -> tuple[str, str]:
    """``(network, dataset)`` of a workload given as ``"network"`` (when unambiguous) or ``"network/dataset"``.

    Raises:
        ConfigError: Unknown or ambiguous name (the message lists the choices).
    """
    choices = known_trace_workloads()
    key = workload.strip().lower()
    if "/" in key:
        if key in choices:
            network, dataset = key.split("/", 1)
            return network, dataset
        raise ConfigError(f"unknown workload {workload!r}; choose one of {', '.join(choices)}")
    matches = [c for c in choices if c.split("/", 1)[0] == key]
    if len(matches) == 1:
        network, dataset = matches[0].split("/", 1)
        return network, dataset
    if matches:
        raise ConfigError(f"workload {workload!r} is ambiguous; choose one of {', '.join(matches)}")
    raise ConfigError(f"unknown workload {workload!r}; choose one of {', '.join(choices)}")


def default_batch_size(gpu: str, workload: str) -> int:
    """Zeus's default batch size of ``workload``, rounded down to a batch size measured on ``gpu``."""
    network, dataset = resolve_workload(workload)
    batches = sorted(t.batch_size for t in load_traces(gpu) if (t.network, t.dataset) == (network, dataset))
    wanted = ZEUS_DEFAULT_BATCH.get((network, dataset), batches[-1])
    fitting = [b for b in batches if b <= wanted]
    return fitting[-1] if fitting else batches[0]


def find_trace(gpu: str, workload: str, batch_size: int | None = None) -> Trace:
    """The trace of ``workload`` at ``batch_size`` on ``gpu`` (Zeus's optimizer for it).

    Args:
        gpu: ``"A40"`` or ``"V100"`` (case-insensitive).
        workload: ``"resnet50"`` or ``"network/dataset"`` such as ``"bert_base_uncased/squad"``.
        batch_size: A measured batch size; ``None`` for the default (see the module docs).

    Raises:
        ConfigError: Unknown GPU, workload or batch size (the message lists the choices).
    """
    key = _trace_gpu(gpu)
    network, dataset = resolve_workload(workload)
    if batch_size is None:
        batch_size = default_batch_size(key, workload)
    candidates = [t for t in load_traces(key) if (t.network, t.dataset) == (network, dataset)]
    for trace in candidates:
        if trace.batch_size == batch_size:
            return trace
    batches = ", ".join(str(t.batch_size) for t in candidates)
    raise ConfigError(f"{network}/{dataset} was not measured at batch size {batch_size} on {key}; "
                      f"measured batch sizes: {batches}")
