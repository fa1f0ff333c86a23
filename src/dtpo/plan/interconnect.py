"""A catalogue of GPU interconnects: nominal bandwidth, latency and fabric efficiency of each link.

Design note
-----------
The scale-out planner prices gradient communication with the alpha-beta model of
:mod:`dtpo.plan.collectives`; this module supplies its alpha (``latency_s``) and beta (1 / bandwidth) for
the links data-parallel jobs meet.

* ``bus_bandwidth_Bps`` is in **bytes** per second, per direction. For an intra-node link (``kind ==
  "intra"``) it is per GPU (what one GPU can push into the NVSwitch or PCIe fabric); for an inter-node
  link (``kind == "inter"``) it is per NIC, and a node's bandwidth is that times its NICs
  (:func:`node_bandwidth`).
* ``efficiency`` is the fraction of the nominal figure that collectives actually reach (NCCL's *busbw* in
  nccl-tests divided by the line rate); :attr:`Link.effective_bandwidth_Bps` is the product, and is what the
  cost models use. Every entry says in its ``note`` why its factor was chosen.
* ``latency_s`` is the per-message (per ring step) latency NCCL pays on that link: a *typical* figure, of the
  order of the per-hop latencies in NCCL's own tuning model (``src/graph/tuning.cc``: NVLink ~0.5-3.4 us,
  PCIe ~1-6 us, network ~3-14 us depending on protocol). Measured figures beat all of these:
  :mod:`dtpo.plan.link_fit` fits alpha and bandwidth to all-reduce timings, and ``loopback`` in particular is
  a placeholder to be calibrated that way.

The figures are typical, not guarantees: a node's PCIe topology, NIC-to-GPU affinity, NCCL version and
protocol choice move them by tens of percent. Each entry's ``source`` says where its number comes from and
marks "typical" where it is one.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass

from dtpo.core.errors import ConfigError

KINDS: tuple[str, ...] = ("intra", "inter")
GB = 1e9  # vendors quote decimal gigabytes (and gigabits)


def _gbit(gbit_per_s: float) -> float:
    """Bytes per second of a link rated ``gbit_per_s`` gigabits per second."""
    return gbit_per_s * GB / 8


@dataclass(frozen=True)
class Link:
    """One interconnect.

    Attributes:
        name: Catalogue name, lower case (``"ib-hdr"``).
        kind: ``"intra"`` (between GPUs of one node) or ``"inter"`` (between nodes).
        bus_bandwidth_Bps: Nominal bandwidth per direction in bytes/s: per GPU for intra-node links, per NIC
            for inter-node links.
        latency_s: Per-message latency (alpha) in seconds.
        source: Where the figures come from; "typical" where they are.
        efficiency: Fraction of the nominal bandwidth collectives achieve, in (0, 1].
        note: Why this efficiency (and anything else a user should know about the entry).
    """

    name: str
    kind: str
    bus_bandwidth_Bps: float
    latency_s: float
    source: str
    efficiency: float = 1.0
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"link {self.name!r}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if not self.bus_bandwidth_Bps > 0:
            raise ConfigError(f"link {self.name!r}: bandwidth must be positive, not {self.bus_bandwidth_Bps!r}")
        if not self.latency_s >= 0:
            raise ConfigError(f"link {self.name!r}: latency must be >= 0 s, not {self.latency_s!r}")
        if not 0 < self.efficiency <= 1:
            raise ConfigError(f"link {self.name!r}: efficiency must be in (0, 1], not {self.efficiency!r}")

    @property
    def effective_bandwidth_Bps(self) -> float:
        """Bandwidth collectives reach: nominal bandwidth x efficiency (bytes/s, per GPU or per NIC)."""
        return self.bus_bandwidth_Bps * self.efficiency

    def with_efficiency(self, efficiency: float) -> Link:
        """The same link with another fabric efficiency (e.g. one measured on the user's cluster).

        Raises:
            ConfigError: ``efficiency`` is not in (0, 1].
        """
        return dataclasses.replace(self, efficiency=efficiency)


_NVLINK_SOURCE = ("NVIDIA {gpu} datasheet ({bidir} GB/s bidirectional NVLink per GPU, half per direction); "
                  "latency typical for NCCL (tuning.cc)")

CATALOGUE: dict[str, Link] = {
    link.name: link
    for link in (
        Link("nvlink3", "intra", 300 * GB, 1.5e-6,
             _NVLINK_SOURCE.format(gpu="A100 SXM4", bidir=600), 0.8,
             "typical: nccl-tests all_reduce busbw on an 8xA100 NVSwitch node is ~230-240 GB/s of 300"),
        Link("nvlink4", "intra", 450 * GB, 1.5e-6,
             _NVLINK_SOURCE.format(gpu="H100 SXM5", bidir=900), 0.8,
             "typical: nccl-tests all_reduce busbw on 8xH100 is ~360 GB/s of 450 without NVLink SHARP (NVLS)"),
        Link("nvlink1", "intra", 80 * GB, 2e-6,
             "NVIDIA Tesla P100 SXM2 datasheet (160 GB/s bidirectional NVLink per GPU: 4 links of 20 GB/s per "
             "direction), DGX-1 hybrid cube-mesh", 0.5,
             "typical: a ring on the DGX-1 cube mesh uses about half of a GPU's links at once"),
        Link("pcie3", "intra", 16 * GB, 4e-6,
             "PCI-SIG Gen3 x16: 8 GT/s x 16 lanes ~16 GB/s per direction; ~12 GB/s usable is typical", 12 / 16,
             "~12 GB/s of 16 is the typical DMA throughput after protocol overhead"),
        Link("pcie4", "intra", 32 * GB, 3e-6,
             "PCI-SIG Gen4 x16: 16 GT/s x 16 lanes ~32 GB/s per direction; ~25 GB/s usable is typical", 25 / 32,
             "~25 GB/s of 32 is the typical DMA throughput after protocol overhead (TLP headers, flow control)"),
        Link("pcie5", "intra", 64 * GB, 3e-6,
             "PCI-SIG Gen5 x16: 32 GT/s x 16 lanes ~64 GB/s per direction; ~50 GB/s usable is typical", 50 / 64,
             "same protocol overhead as Gen4: ~50 GB/s of 64 usable"),
        Link("ib-hdr", "inter", _gbit(200), 3e-6,
             "NVIDIA ConnectX-6 HDR InfiniBand, 200 Gb/s per port; latency typical for NCCL over IB (2-5 us)", 0.85,
             "typical: NCCL busbw over IB with GPUDirect RDMA reaches ~0.8-0.9 of line rate"),
        Link("ib-ndr", "inter", _gbit(400), 3e-6,
             "NVIDIA ConnectX-7 NDR InfiniBand, 400 Gb/s per port; latency typical for NCCL over IB (2-5 us)", 0.85,
             "typical: NCCL busbw over IB with GPUDirect RDMA reaches ~0.8-0.9 of line rate"),
        Link("roce-100g", "inter", _gbit(100), 7e-6,
             "100 GbE RoCE v2 NIC, 100 Gb/s; latency typical for NCCL over RoCE (5-10 us)", 0.8,
             "typical: a lossless (PFC/ECN) RoCE fabric gets a little less than IB, ~0.75-0.85 of line rate"),
        Link("roce-200g", "inter", _gbit(200), 7e-6,
             "200 GbE RoCE v2 NIC (e.g. NVIDIA ConnectX-6 Dx/ConnectX-7), 200 Gb/s; latency typical for NCCL over "
             "RoCE (5-10 us)", 0.8,
             "as roce-100g: a lossless (PFC/ECN) RoCE fabric gets ~0.75-0.85 of line rate"),
        Link("roce-400g", "inter", _gbit(400), 7e-6,
             "400 GbE RoCE v2 NIC (e.g. NVIDIA ConnectX-7, BlueField-3), 400 Gb/s; latency typical for NCCL over RoCE "
             "(5-10 us)", 0.8,
             "as roce-100g: a lossless (PFC/ECN) RoCE fabric gets ~0.75-0.85 of line rate"),
        Link("eth-25g-tcp", "inter", _gbit(25), 30e-6,
             "25 GbE, NCCL socket transport over TCP; latency typical for kernel TCP (20-50 us)", 0.6,
             "typical: TCP through the kernel with few NCCL socket threads reaches ~0.5-0.7 of line rate"),
        Link("nvlink2", "intra", 150 * GB, 1.5e-6,
             _NVLINK_SOURCE.format(gpu="Tesla V100 SXM2/SXM3", bidir=300) + "; 6 links of 25 GB/s per direction",
             0.8,
             "typical, for an NVSwitch node (DGX-2, HGX-2): every GPU's six links go into the switches and a ring "
             "uses all of them, as on the A100 NVSwitch node (nvlink3, ~0.8 of line rate in nccl-tests); a DGX-1 "
             "hybrid cube mesh reaches less (see nvlink1)"),
        Link("ib-edr", "inter", _gbit(100), 3e-6,
             "NVIDIA (Mellanox) ConnectX-5 EDR InfiniBand, 100 Gb/s per port (DGX-1: 4, DGX-2: 8 per node, "
             "datasheets); latency typical for NCCL over IB (2-5 us)", 0.85,
             "typical: NCCL busbw over IB with GPUDirect RDMA reaches ~0.8-0.9 of line rate"),
        Link("xgmi-mi300x", "intra", 7 * 64 * GB, 2e-6,
             "AMD Instinct MI300X platform: each GPU has 7 Infinity Fabric (xGMI) links of 64 GB/s per direction, "
             "one to each of its 7 peers (fully connected mesh); AMD ROCm blog 'Understanding RCCL Bandwidth and "
             "xGMI Performance on AMD Instinct MI300X' (2025-03-02); latency typical for RCCL", 0.75,
             "the same blog: CRC and protocol overhead leave ~48 GB/s usable of each link's 64 (75 %), and RCCL's "
             "rings use all 7 links at once"),
        Link("loopback", "intra", 10 * GB, 10e-6,
             "placeholder, not a measurement: processes on one host over shared memory / TCP loopback", 1.0,
             "placeholder to be calibrated with dtpo.plan.link_fit; host memcpy rates vary widely (~5-20 GB/s)"),
    )
}

ALIASES: dict[str, str] = {
    "nvlink-3": "nvlink3", "nvlink3.0": "nvlink3", "a100-nvlink": "nvlink3", "nvswitch-a100": "nvlink3",
    "nvlink-4": "nvlink4", "nvlink4.0": "nvlink4", "h100-nvlink": "nvlink4", "nvswitch-h100": "nvlink4",
    "nvlink-2": "nvlink2", "nvlink2.0": "nvlink2", "v100-nvlink": "nvlink2", "nvswitch-v100": "nvlink2",
    "pcie-4": "pcie4", "pcie-gen4": "pcie4", "pcie4.0": "pcie4", "gen4": "pcie4",
    "pcie-5": "pcie5", "pcie-gen5": "pcie5", "pcie5.0": "pcie5", "gen5": "pcie5",
    "hdr": "ib-hdr", "infiniband-hdr": "ib-hdr", "ibhdr": "ib-hdr",
    "edr": "ib-edr", "infiniband-edr": "ib-edr", "ibedr": "ib-edr",
    "ndr": "ib-ndr", "infiniband-ndr": "ib-ndr", "ibndr": "ib-ndr",
    "roce": "roce-100g", "roce100": "roce-100g", "roce-100": "roce-100g", "roce100g": "roce-100g",
    "roce200": "roce-200g", "roce-200": "roce-200g", "roce200g": "roce-200g",
    "roce400": "roce-400g", "roce-400": "roce-400g", "roce400g": "roce-400g",
    "tcp": "eth-25g-tcp", "25gbe": "eth-25g-tcp", "eth-25g": "eth-25g-tcp", "ethernet-25g": "eth-25g-tcp",
    "shm": "loopback", "localhost": "loopback", "local": "loopback",
    "xgmi": "xgmi-mi300x", "infinity-fabric": "xgmi-mi300x", "mi300x-xgmi": "xgmi-mi300x",
}


def link_names() -> list[str]:
    """Catalogue names of the known links (aliases not included), in catalogue order."""
    return list(CATALOGUE)


def find_link(name: str) -> Link:
    """The catalogue link called ``name``, or one of its aliases (case-insensitive, ``_`` read as ``-``).

    Raises:
        ConfigError: No such link; the one-line message names it and lists the known ones.
    """
    key = str(name).strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in CATALOGUE:
        raise ConfigError(f"unknown link {name!r}; known links: {', '.join(link_names())}")
    return CATALOGUE[key]


def node_bandwidth(link: Link, nics: int = 1, *, effective: bool = False) -> float:
    """Bandwidth of one node on ``link``, bytes/s: per-NIC bandwidth x ``nics`` for an inter-node link.

    For an intra-node link the figure is already per GPU and ``nics`` must be 1. With ``effective`` the
    fabric efficiency is applied (:attr:`Link.effective_bandwidth_Bps`), else the nominal figure is used.

    Raises:
        ConfigError: ``nics`` is not a positive integer, or is not 1 for an intra-node link.
    """
    try:
        count = operator.index(nics)
    except TypeError:
        count = 0
    if isinstance(nics, bool) or count < 1:
        raise ConfigError(f"NICs per node must be a positive integer, not {nics!r}")
    if link.kind == "intra" and count != 1:
        raise ConfigError(f"link {link.name!r} is intra-node (bandwidth per GPU): NICs per node do not apply")
    per_nic = link.effective_bandwidth_Bps if effective else link.bus_bandwidth_Bps
    return per_nic * count
