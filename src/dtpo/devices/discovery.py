"""Choosing the best power source present on each node, and saying what was chosen and why."""

from __future__ import annotations

from dataclasses import dataclass, field

from dtpo.devices.base import Device, DeviceError
from dtpo.devices.modelled_cpu import ModelledCpu, ModelledDram


@dataclass
class Discovery:
    """The devices a rank measures and one line per choice made.

    Attributes:
        devices: Devices to measure.
        notes: What was picked and why (e.g. "cpu: RAPL unreadable (...); using the modelled CPU").
    """

    devices: list[Device] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def estimated(self) -> bool:
        """True if any chosen device is modelled."""
        return any(d.info.estimated for d in self.devices)


def discover(local_rank: int | None = None, gpus: bool = True, node_shared: bool = True,
             cpu_tdp_w: float | None = None, poll_interval_s: float = 0.1) -> Discovery:
    """Open the best energy source for each kind of device.

    GPUs: NVML (its total-energy counter, else polled power). CPUs and DRAM: RAPL through Linux powercap,
    else the modelled CPU and DRAM (labelled estimated). Measuring never stops training: a source that
    cannot be opened is noted and skipped.

    Args:
        local_rank: This rank's index on its node (its GPU); ``None`` opens every visible GPU.
        gpus: Look for GPUs at all (False on a CPU-only run).
        node_shared: Open the node's shared devices (CPU packages, DRAM). Only one rank per node should, so
            that they are counted once per node.
        cpu_tdp_w: The user's CPU TDP for the modelled CPU (``--cpu-tdp``).
        poll_interval_s: Polling period for GPUs without an energy counter.
    """
    found = Discovery()
    if gpus:
        try:
            from dtpo.devices.nvml import open_nvml_gpus

            opened = open_nvml_gpus(local_rank=local_rank, poll_interval_s=poll_interval_s)
            found.devices += opened
            found.notes += [f"gpu: {d.info.name} via {d.info.source}" for d in opened]
        except DeviceError as exc:
            found.notes.append(f"gpu: not measured: {exc}")
    if not node_shared:
        found.notes.append("cpu, dram: counted by local rank 0 of this node")
        return found
    try:
        from dtpo.devices.rapl import open_rapl

        zones = open_rapl()
        found.devices += zones
        found.notes.append("cpu, dram: RAPL (" + ", ".join(z.info.name for z in zones) + ")")
        if not any(z.info.kind == "dram" for z in zones):
            found.notes.append("dram: no RAPL dram domain on this host; not measured")
        return found
    except DeviceError as exc:
        reason = str(exc)
    try:
        cpu = ModelledCpu(cpu_tdp_w=cpu_tdp_w)
    except DeviceError as exc:
        found.notes.append(f"cpu: not measured: RAPL unavailable ({reason}) and the model failed: {exc}")
        return found
    found.devices += [cpu, ModelledDram()]
    found.notes.append(f"cpu, dram: modelled, estimated (RAPL unavailable: {reason}); TDP from {cpu.tdp_source}")
    return found
