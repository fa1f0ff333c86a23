"""The planner's input: one scale-out scenario, read from a TOML or JSON file.

A scenario names the hardware (GPU model, GPUs per node, links), the job (model size, strategy, precision,
compression, batch and accumulation), what is known of its compute time (a baseline or FLOPs per sample),
and, optionally, power, prices and the amount of work to price. :mod:`dtpo.plan.scenario_reader` reads one:
``load_scenario`` from a file, ``scenario_from_dict`` from a dict. Every bad value raises
:class:`~dtpo.core.errors.ConfigError` with one line that names the file and the field path
(``h100.toml: model.parameters must be a positive integer, got -3``); unknown keys are errors too
(``unknown field 'gpus_per_nod' (did you mean 'gpus_per_node'?)``).

Schema (``model.x`` is key ``x`` of table ``model``; "required" fields must be given, "-" fields may be left
out; ``baseline`` and ``work`` each take one of the forms their rows offer)::

    -----------------------------  -----------------  --------  ------------  ------------------------------------------
    field                          type               unit      default       meaning
    -----------------------------  -----------------  --------  ------------  ------------------------------------------
    gpu                            str                          required      GPU model: a power-model name or alias
                                                                              as dtpo simulate list names them (A40,
                                                                              H100-SXM, L40S, T4, MI300X, ...; H100,
                                                                              A100, ...), any GPU of the datasheet
                                                                              catalogue (H100 PCIe, L40S, ...), or cpu
                                                                              (then power.busy_power_w is required)
    gpus_per_node                  int >= 1                     8             GPUs (or CPU workers) per node
    gpu_counts                     list[int > 0]                required      GPU counts to predict; each one above
                                                                              gpus_per_node must be a multiple of it
    intra_link                     str                          "nvlink4"     link between the GPUs of a node (one of
                                                                              KNOWN_LINKS)
    inter_link                     str                          "ib-ndr"      link between nodes (one of KNOWN_LINKS)
    nics_per_node                  int >= 1                     8             inter-node NICs per node
    fabric_efficiency              float in (0, 1]              -             achieved / nominal bandwidth; overrides
                                                                              the link catalogue's figure
    model.parameters               int > 0                      -             trainable parameters (exactly one of
                                                                              parameters, gradient_bytes)
    model.gradient_bytes           int > 0            B         -             gradient bytes synchronised per step
    model.gradient_dtype           str                          "fp32"        fp32, bf16 or fp16: gradient element size
                                                                              used with parameters
    model.flops_per_sample         float > 0          FLOP      -             training FLOPs per sample (forward and
                                                                              backward)
    strategy                       str                          "ddp"         ddp or fsdp
    precision                      str                          "bf16-mixed"  32-true, bf16-mixed or 16-mixed
    compression                    str                          "none"        none, fp16, bf16 or powersgd (none with
                                                                              fsdp)
    powersgd_rank                  int 1-4                      1             PowerSGD's approximation rank
    overlap                        bool                         true          gradient all-reduce overlaps backward
                                                                              (DDP buckets); false where it runs after
                                                                              backward (apex's post-accumulation
                                                                              all-reduce, parameter servers)
    jitter_cv                      float in [0, 1]              0.02 / run    relative step-to-step spread of one
                                                                              micro-batch's compute on one GPU: steps
                                                                              wait for the slowest GPU (a run's own
                                                                              when planning from one)
    overlap_slowdown               float in [0, 1]              0.5           share of the communication hidden behind
                                                                              backward that still delays it on GPUs
                                                                              (NCCL kernels share the GPU)
    per_gpu_batch                  int > 0 | table    sample    required      micro-batch per GPU: one number, or one
                                                                              per GPU count like grad_accum ({8 = 32,
                                                                              256 = 16}); compute per micro-batch
                                                                              scales with it (same time per sample)
    grad_accum                     int >= 1 | table             1             micro-batches per optimizer step: one
                                                                              number, or one per GPU count, for every
                                                                              count of gpu_counts and no other
                                                                              ({8 = 32, 16 = 16}); see accum_at
    baseline.gpus                  int > 0            GPU       -             GPU count of a known throughput, with
                                                                              baseline.throughput
    baseline.throughput            float > 0          sample/s  -             throughput measured (or published) at
                                                                              baseline.gpus
    baseline.run_dir               str (path)                   -             or: a dtpo run directory holding
                                                                              record.json (relative paths: to the
                                                                              current directory)
    baseline.compute_s_per_sample  float > 0          s         -             or: compute time of one sample on one GPU
    baseline.multi_node_gpus       int > gpus_per_n.  GPU       -             a second measurement on 2 or more nodes
                                                                              (with baseline.multi_node_throughput):
                                                                              a per-step cost the framework adds
                                                                              across nodes is fitted from it
    baseline.multi_node_throughput float > 0          unit      -             throughput measured there
    unit                           str                          "samples/s"   unit of every throughput given and shown:
                                                                              samples/s, sequences/s, images/s or
                                                                              tokens/s (then sequence_length)
    sequence_length                int > 0            token     -             tokens per sample (with tokens/s)
    micro_batch.fixed_share        float in [0, 1)              0 (assumed)   share of a micro-batch's compute at the
                                                                              calibration batch that does not shrink
                                                                              with the batch (launches, framework);
                                                                              the plan shows 0 % against 20 %
    micro_batch.times_s            table              s         -             or: one micro-batch's compute measured at
                                                                              two or more batch sizes ({8 = 0.011,
                                                                              32 = 0.029}): the fixed part is fitted
                                                                              (from three or more, with its 95 %
                                                                              range: the plan shows both ends)
    power.setting                  "max" | float > 0  W         "max"         GPU power setting: the maximum, or a power
                                                                              limit in the GPU's range
    power.node_overhead_w          float >= 0         W         1500.0        CPUs, memory, NICs, switches, fans of one
                                                                              node (see below)
    power.pue                      float >= 1                   1.0           power usage effectiveness of the facility:
                                                                              multiplies all energy
    power.waiting_power_fraction   float in [0, 1]              -             GPU power while waiting on exposed
                                                                              communication / busy power
    power.busy_power_w             float > 0          W         -             measured power of one GPU (or CPU worker)
                                                                              while computing
    power.workload                 str                          "bert_base_   traced workload whose GPU-model constants
                                                                uncased/      stand in for this job's when --deadline /
                                                                squad"        --budget weigh lower power limits
    prices.per_gpu_hour            float >= 0         $/GPU-h   -             price of one GPU for one hour
    prices.per_kwh                 float >= 0         $/kWh     -             price of one kWh at the facility meter
    prices.grid_g_co2_per_kwh      float >= 0         g/kWh     475.0         carbon intensity of the electricity (see
                                                                              below)
    work.samples                   int > 0            sample    -             the work to price: samples in all; or:
    work.epochs                    float > 0                    -             epochs over work.dataset_samples
    work.dataset_samples           int > 0            sample    -             samples in the data set
    -----------------------------  -----------------  --------  ------------  ------------------------------------------

At least one way to know the compute time must be given: ``baseline`` or ``model.flops_per_sample``.

Defaults and their sources:

* ``power.node_overhead_w = 1500``: an estimate for a DGX A100-class node at training load. The nameplate
  leaves 6.5 kW (DGX A100 maximum system power) - 8 x 400 W (GPUs) = 3.3 kW for everything else, an upper
  bound that includes power-supply headroom; the parts draw less at load (two 225 W-TDP AMD EPYC 7742 CPUs,
  1-2 TB of DRAM, NVSwitches, about ten 200 Gb/s NICs, NVMe drives, fans), so the default takes about half of
  it. Replace it with a measured figure (a node's PDU or BMC reading minus its GPUs) where there is one.
* ``prices.grid_g_co2_per_kwh = 475``: the world-average carbon intensity of electricity generation in 2018
  reported by the IEA (Global Energy & CO2 Status Report 2018); use the local grid's figure where known.
* ``powersgd_rank = 1``: PyTorch's ``PowerSGDState(matrix_approximation_rank=1)`` default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.catalogue import GpuSpec, find_gpu
from dtpo.devices.physics.power_specs import PowerSpec, find_power_spec
from dtpo.plan.interconnect import link_names

KNOWN_LINKS: tuple[str, ...] = tuple(link_names())

CPU = "cpu"
GRADIENT_DTYPES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes per gradient element
DEFAULT_NODE_OVERHEAD_W = 1500.0  # estimate for a DGX A100-class node at load: see the module docstring
DEFAULT_GRID_G_CO2_PER_KWH = 475.0  # IEA world average, 2018: see the module docstring
SUFFIXES: tuple[str, ...] = (".toml", ".json")



# ---------------------------------------------------------------------------------------------- the sections


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know of the model.

    Attributes:
        parameters: Trainable parameters, or ``None`` when ``gradient_bytes`` is given.
        gradient_bytes: Gradient size per step in bytes, or ``None`` when ``parameters`` is given.
        gradient_dtype: ``fp32``, ``bf16`` or ``fp16``: the element size used with ``parameters``.
        flops_per_sample: Training FLOPs per sample (forward and backward), if known.
    """

    parameters: int | None = None
    gradient_bytes: int | None = None
    gradient_dtype: str = "fp32"
    flops_per_sample: float | None = None

    @property
    def gradient_size_bytes(self) -> int:
        """Bytes of gradient one optimizer step synchronises (before any compression)."""
        if self.gradient_bytes is not None:
            return self.gradient_bytes
        assert self.parameters is not None  # from_dict guarantees one of the two
        return self.parameters * GRADIENT_DTYPES[self.gradient_dtype]


@dataclass(frozen=True)
class Baseline:
    """One way to know the compute time: a throughput at a GPU count, a dtpo run, or seconds per sample.

    Exactly one form is set: ``gpus`` with ``throughput``, ``run_dir``, or ``compute_s_per_sample``.

    Attributes:
        gpus: GPU count of the measured throughput.
        throughput: Measured throughput at ``gpus`` GPUs, in samples per second.
        run_dir: A dtpo run directory holding ``record.json`` (resolved against the base directory).
        compute_s_per_sample: Compute time of one sample on one GPU, in seconds.
        multi_node_gpus: GPU count of a second measurement on two or more nodes (a framework term is fitted from
            it), or ``None``.
        multi_node_throughput: Throughput measured at ``multi_node_gpus``, in samples per second.
    """

    gpus: int | None = None
    throughput: float | None = None
    run_dir: Path | None = None
    compute_s_per_sample: float | None = None
    multi_node_gpus: int | None = None
    multi_node_throughput: float | None = None

    @property
    def kind(self) -> str:
        """``"throughput"``, ``"run_dir"`` or ``"compute_s_per_sample"``: which form this baseline has."""
        if self.throughput is not None:
            return "throughput"
        if self.run_dir is not None:
            return "run_dir"
        return "compute_s_per_sample"


@dataclass(frozen=True)
class PowerSection:
    """How the GPUs are run and what else draws power.

    Attributes:
        setting: ``"max"`` or a GPU power limit in watts.
        node_overhead_w: Power of everything in a node but its GPUs (CPUs, memory, NICs, switches, fans).
        pue: Power usage effectiveness of the facility (>= 1): multiplies all energy.
        waiting_power_fraction: GPU power while waiting on exposed communication, as a fraction of its busy
            power; ``None``: estimated from the GPU's idle power (see :mod:`dtpo.plan.power_at_scale`).
        busy_power_w: Measured GPU (or CPU worker) power while computing; ``None``: estimated from the GPU's
            maximum power.
        workload: Traced workload standing in for this job in the GPU model when lower power limits are weighed
            (:mod:`dtpo.plan.power_setting`); ``None``: its default.
    """

    setting: str | float = "max"
    node_overhead_w: float = DEFAULT_NODE_OVERHEAD_W
    pue: float = 1.0
    waiting_power_fraction: float | None = None
    busy_power_w: float | None = None
    workload: str | None = None

    @property
    def power_limit_w(self) -> float | None:
        """The power limit in watts, or ``None`` for ``"max"``."""
        return None if self.setting == "max" else float(self.setting)


@dataclass(frozen=True)
class Prices:
    """What time, energy and carbon cost.

    Attributes:
        per_gpu_hour: Price of one GPU for one hour, or ``None`` if not priced.
        per_kwh: Price of one kWh of electricity (at the facility meter), or ``None`` if not priced.
        grid_g_co2_per_kwh: Carbon intensity of the electricity in g CO2 per kWh.
    """

    per_gpu_hour: float | None = None
    per_kwh: float | None = None
    grid_g_co2_per_kwh: float = DEFAULT_GRID_G_CO2_PER_KWH


@dataclass(frozen=True)
class Work:
    """The amount of work to price: ``samples``, or ``epochs`` over ``dataset_samples``.

    Attributes:
        samples: Training samples in all.
        epochs: Passes over the data set (with ``dataset_samples``).
        dataset_samples: Samples in the data set (with ``epochs``).
    """

    samples: int | None = None
    epochs: float | None = None
    dataset_samples: int | None = None

    @property
    def total_samples(self) -> int:
        """Samples to train on, in all."""
        if self.samples is not None:
            return self.samples
        assert self.epochs is not None and self.dataset_samples is not None  # from_dict guarantees both
        return max(1, round(self.epochs * self.dataset_samples))


@dataclass(frozen=True)
class MicroBatch:
    """What is known of a micro-batch's fixed part (see :mod:`dtpo.plan.batch_fit`): a share, or measured times.

    Attributes:
        fixed_share: Share of a micro-batch's compute at the calibration batch that does not shrink with it.
        times_s: ``((batch, seconds), ...)`` measured at two or more batch sizes, ascending.
    """

    fixed_share: float | None = None
    times_s: tuple[tuple[int, float], ...] | None = None


THROUGHPUT_UNITS: tuple[str, ...] = ("samples/s", "sequences/s", "images/s", "tokens/s")


# ---------------------------------------------------------------------------------------------- the scenario


@dataclass(frozen=True)
class Scenario:
    """One scale-out scenario: hardware, job, what is known of compute time, power, prices and work.

    Build it with :meth:`from_dict` or :func:`load_scenario`, which validate every field; the module
    docstring has the schema.

    Attributes:
        gpu: GPU model as written in the file (or ``"cpu"``).
        gpu_counts: GPU counts to predict, ascending.
        model: Model size and FLOPs.
        per_gpu_batch: Micro-batch per GPU, in samples: one for every count, or ``((gpus, batch), ...)`` for each
            count of ``gpu_counts``, ascending; read it with :meth:`batch_at`.
        gpus_per_node: GPUs per node.
        intra_link: Link between the GPUs of a node.
        inter_link: Link between nodes.
        nics_per_node: Inter-node NICs per node.
        fabric_efficiency: Achieved / nominal bandwidth, overriding the link catalogue; ``None``: the catalogue's.
        strategy: ``ddp`` or ``fsdp``.
        precision: ``32-true``, ``bf16-mixed`` or ``16-mixed``.
        compression: ``none``, ``fp16``, ``bf16`` or ``powersgd``.
        powersgd_rank: PowerSGD's approximation rank (used with ``compression = "powersgd"``).
        grad_accum: One accumulation for every count, or ``((gpus, accumulation), ...)`` for each count of
            ``gpu_counts``, ascending; read it with :meth:`accum_at`.
        overlap: Whether the gradient all-reduce overlaps backward (DDP's buckets) or runs after it.
        jitter_cv: Relative step-to-step spread of one micro-batch's compute on one GPU; ``None``: a run's
            measured one, else :data:`dtpo.plan.step_model.DEFAULT_JITTER_CV`.
        overlap_slowdown: Share of the hidden communication that still delays backward on GPUs; ``None``:
            :data:`dtpo.plan.step_model.DEFAULT_OVERLAP_SLOWDOWN`.
        baseline: A measured throughput, run directory or compute time per sample; ``None``: use FLOPs.
        power: Power setting, node overhead and PUE.
        prices: GPU-hour and energy prices and grid carbon intensity.
        work: The amount of work to price, if given.
        source: Where the scenario came from (the file), for messages.
        unit: Unit of every throughput given and shown (:data:`THROUGHPUT_UNITS`).
        sequence_length: Tokens per sample, with ``unit = "tokens/s"``.
        micro_batch: What is known of a micro-batch's fixed part; ``None``: nothing (assumed 0).
    """

    gpu: str
    gpu_counts: tuple[int, ...]
    model: ModelSpec
    per_gpu_batch: int | tuple[tuple[int, int], ...]
    gpus_per_node: int = 8
    intra_link: str = "nvlink4"
    inter_link: str = "ib-ndr"
    nics_per_node: int = 8
    fabric_efficiency: float | None = None
    strategy: str = "ddp"
    precision: str = "bf16-mixed"
    compression: str = "none"
    powersgd_rank: int = 1
    grad_accum: int | tuple[tuple[int, int], ...] = 1
    overlap: bool = True
    jitter_cv: float | None = None
    overlap_slowdown: float | None = None
    baseline: Baseline | None = None
    power: PowerSection = field(default_factory=PowerSection)
    prices: Prices = field(default_factory=Prices)
    work: Work | None = None
    source: str = ""
    unit: str = "samples/s"
    sequence_length: int | None = None
    micro_batch: MicroBatch | None = None

    @property
    def is_cpu(self) -> bool:
        """Whether the workers are CPU processes rather than GPUs."""
        return self.gpu.strip().lower() == CPU

    @property
    def power_spec(self) -> PowerSpec | None:
        """The GPU's power model, if dtpo has one for it."""
        return resolve_gpu(self.gpu)[0]

    @property
    def gpu_spec(self) -> GpuSpec | None:
        """The GPU's datasheet entry, if the catalogue has one."""
        return resolve_gpu(self.gpu)[1]

    def accum_at(self, gpus: int, nearest: bool = False) -> int:
        """Gradient accumulation (micro-batches per optimizer step) at ``gpus`` GPUs (with ``nearest``, the nearest
        count's where ``gpus`` has none).

        Raises:
            ConfigError: Accumulation is given per GPU count, ``gpus`` is not one of them and ``nearest`` is false.
        """
        return _at(self.grad_accum, gpus, "grad_accum", self.source, nearest)

    def batch_at(self, gpus: int, nearest: bool = False) -> int:
        """Per-GPU micro-batch at ``gpus`` GPUs (with ``nearest``, the nearest count's where ``gpus`` has none).

        Raises:
            ConfigError: The batch is given per GPU count, ``gpus`` is not one of them and ``nearest`` is false.
        """
        return _at(self.per_gpu_batch, gpus, "per_gpu_batch", self.source, nearest)

    def samples_per_step(self, gpus: int) -> int:
        """Samples in one optimizer step at ``gpus`` GPUs: per-GPU batch x accumulation x GPUs."""
        return self.batch_at(gpus) * self.accum_at(gpus) * gpus

    @property
    def units_per_sample(self) -> int:
        """How many of :attr:`unit`'s items one sample holds (its tokens with ``tokens/s``, else 1)."""
        return (self.sequence_length or 1) if self.unit == "tokens/s" else 1

    def nodes(self, gpus: int) -> int:
        """Nodes that ``gpus`` GPUs occupy (a partly used node counts as one)."""
        return math.ceil(gpus / self.gpus_per_node)


def _at(value: int | tuple[tuple[int, int], ...], gpus: int, name: str, source: str, nearest: bool) -> int:
    """A per-GPU-count field's value at ``gpus``: the one number, or the table's entry; where the table has none,
    the nearest count's with ``nearest``, else ConfigError."""
    if isinstance(value, int):
        return value
    for count, number in value:
        if count == gpus:
            return number
    if nearest:
        return min(value, key=lambda kv: abs(kv[0] - gpus))[1]
    raise _fail(source, f"{name} has no entry for {gpus} GPUs (it has {', '.join(str(c) for c, _ in value)})")


def resolve_gpu(name: str) -> tuple[PowerSpec | None, GpuSpec | None]:
    """The power model and the datasheet entry of a GPU name (either may be ``None``; both for ``cpu``)."""
    if name.strip().lower() == CPU:
        return None, None
    try:
        power = find_power_spec(name)
    except ConfigError:
        power = None
    sheet = find_gpu(name) or (find_gpu(power.name) if power is not None else None)
    return power, sheet


def _fail(where: str, message: str) -> ConfigError:
    """A one-line error prefixed with where the scenario came from."""
    return ConfigError(f"{where}: {message}" if where else message)
