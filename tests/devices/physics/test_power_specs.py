"""The GPU power catalogue: every spec self-consistent and tied to its datasheet entry, names and aliases resolve
(``a100``/``h100`` still the SXM parts), device names as tools spell them map to the right part, and a GPU
outside the catalogue gets the power-limit range of its trace."""

from __future__ import annotations

import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.catalogue import GPUS, find_gpu
from dtpo.devices.physics.gpu_model import load_model
from dtpo.devices.physics.power_specs import (
    POWER_SPECS,
    PowerSpec,
    find_power_spec,
    match_power_spec,
    power_spec_names,
    trace_range_name,
    trace_range_spec,
)

NEW_GPUS = ("P100-PCIe", "P100-SXM2", "T4", "RTX6000", "A6000", "L4", "L40S", "A100-PCIe", "H100-PCIe", "H200",
            "B200", "MI300X")
# The catalogue entry (datasheet FLOP/s, board power, bandwidth) each power spec takes its figures from.
SHEETS = {"H100-SXM": "NVIDIA H100 SXM", "A100-SXM": "NVIDIA A100", "A40": "NVIDIA A40",
          "MI250X": "AMD Instinct MI250X", "P100-PCIe": "NVIDIA P100 PCIe", "P100-SXM2": "NVIDIA P100",
          "T4": "NVIDIA T4", "RTX6000": "NVIDIA Quadro RTX 6000", "A6000": "NVIDIA RTX A6000", "L4": "NVIDIA L4",
          "L40S": "NVIDIA L40S", "A100-PCIe": "NVIDIA A100 PCIe", "H100-PCIe": "NVIDIA H100 PCIe",
          "H200": "NVIDIA H200", "B200": "NVIDIA B200", "MI300X": "AMD Instinct MI300X"}


def test_the_catalogue_holds_the_new_gpus_after_the_first_five() -> None:
    assert power_spec_names() == ["A40", "V100", "H100-SXM", "A100-SXM", "MI250X", *NEW_GPUS]


@pytest.mark.parametrize("spec", POWER_SPECS, ids=[s.name for s in POWER_SPECS])
def test_every_spec_is_self_consistent(spec: PowerSpec) -> None:
    assert 0 < spec.min_power_w < spec.max_power_w
    assert 0 < spec.idle_power_w <= spec.static_power_w < spec.min_power_w
    clocks = spec.sm_clocks_mhz
    assert len(clocks) > 20 and list(clocks) == sorted(set(clocks))
    assert (clocks[0], clocks[-1]) == (spec.min_sm_mhz, spec.max_sm_mhz) and spec.min_sm_mhz < spec.max_sm_mhz
    steps = {b - a for a, b in zip(clocks, clocks[1:], strict=False)}
    assert max(steps) <= 16 and min(steps) >= 7  # 15 MHz (Ampere and later), 7.5 (Volta), ~12.7 (Pascal)
    assert spec.peak_flops > 1e13 and spec.memory_bandwidth_bps > 1e11
    assert len(spec.source) > 40 and not spec.from_trace
    if not spec.fitted:  # the module's rules for GPUs without a measured trace
        assert spec.static_power_w == pytest.approx(spec.idle_power_w + 0.07 * spec.max_power_w, abs=0.5)
        assert (spec.v_floor, spec.v_knee) == (0.65, 0.60)
        assert "estimated" in spec.source
    assert load_model(spec.name, "resnet50", calibrated=False).at(None).power_limit_w == spec.max_power_w  # default


@pytest.mark.parametrize("name", sorted(SHEETS))
def test_figures_match_the_datasheet_catalogue(name: str) -> None:
    spec, sheet = find_power_spec(name), next(g for g in GPUS if g.name == SHEETS[name])
    assert spec.peak_flops == sheet.fp16 and spec.max_power_w == sheet.tdp_w
    if name in NEW_GPUS:
        assert spec.memory_bandwidth_bps == sheet.memory_bps
    assert find_gpu(sheet.name) is sheet  # the entry is reachable by its own name ("more specific first")


@pytest.mark.parametrize(("alias", "name"), [
    ("p100", "P100-PCIe"), ("P100-SXM2", "P100-SXM2"), ("t4", "T4"), ("Tesla T4", "T4"), ("l4", "L4"),
    ("l40s", "L40S"), ("a100-pcie", "A100-PCIe"), ("h100-pcie", "H100-PCIe"), ("h200", "H200"), ("b200", "B200"),
    ("mi300x", "MI300X"), ("rtx-6000", "RTX6000"), ("Quadro RTX 6000", "RTX6000"), ("a6000", "A6000"),
    ("RTX A6000", "A6000"),
    # the names that resolved before keep resolving as they did
    ("a100", "A100-SXM"), ("h100", "H100-SXM"), ("A100-SXM4", "A100-SXM"), ("v100", "V100"), ("mi250", "MI250X"),
    ("nvidia a40", "A40"),
])
def test_names_and_aliases_resolve(alias: str, name: str) -> None:
    assert find_power_spec(alias).name == name
    assert find_power_spec(f"  {alias.upper()} ").name == name


def test_no_name_or_alias_names_two_gpus() -> None:
    keys = [key for spec in POWER_SPECS for key in {spec.name.lower(), *spec.aliases}]
    assert len(keys) == len(set(keys))
    assert all(alias == alias.lower() for spec in POWER_SPECS for alias in spec.aliases)


@pytest.mark.parametrize(("device", "name"), [
    ("Tesla P100-PCIE-16GB", "P100-PCIe"), ("Tesla P100-SXM2-16GB", "P100-SXM2"), ("Tesla T4", "T4"),
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA L40", None), ("NVIDIA A100 80GB PCIe", "A100-PCIe"),
    ("NVIDIA A100-PCIE-40GB", None), ("NVIDIA A100-SXM4-40GB", "A100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 NVL", None), ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"), ("NVIDIA GB200", None), ("Quadro RTX 6000", "RTX6000"), ("NVIDIA RTX A6000", "A6000"),
    ("NVIDIA RTX 6000 Ada Generation", None), ("Tesla V100-SXM2-32GB", None), ("Tesla V100-PCIE-16GB", "V100"),
    ("AMD Instinct MI300X", "MI300X"), ("Tesla K80", None), ("h200", "H200"),
])
def test_device_names_map_to_the_right_part(device: str, name: str | None) -> None:
    spec = match_power_spec(device)
    assert (None if spec is None else spec.name) == name


def test_a_gpu_outside_the_catalogue_takes_the_range_of_its_trace() -> None:
    spec = trace_range_spec(125.0, 250.0)
    assert spec.name == trace_range_name(125, 250) == "unlisted-125-250W" and spec.from_trace
    assert (spec.min_power_w, spec.max_power_w) == (125.0, 250.0)
    assert spec.static_power_w == pytest.approx(0.17 * 250.0) and "estimates" in spec.source
    assert find_power_spec("Unlisted-125-250W") == spec  # the name rebuilds it (a state file, a record)
    assert find_power_spec("unlisted-62.5-70W").min_power_w == 62.5
    assert spec.name not in power_spec_names()
    for low, high in ((250, 125), (0, 100), (100, 100), (100, 20_000)):
        with pytest.raises(ConfigError, match="power-limit range must satisfy"):
            trace_range_spec(low, high)
    with pytest.raises(ConfigError, match="unknown GPU model 'unlisted-abc'; choose one of A40, .*, MI300X$"):
        find_power_spec("unlisted-abc")


@pytest.mark.parametrize("name, spec", [
    ("gpu0 (NVIDIA A40)", "A40"),  # dtpo's own device name: the dry-run model figure looks it up so
    ("gpu3 (Tesla V100-PCIE-32GB)", "V100"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM"),
    ("gpu1 (NVIDIA H100 PCIe)", "H100-PCIe"),  # not the SXM part's 700 W
])
def test_nvml_and_dtpo_device_names_find_their_spec(name: str, spec: str) -> None:
    found = match_power_spec(name)
    assert found is not None and found.name == spec


def test_an_unknown_gpu_by_device_name_has_no_spec() -> None:
    assert match_power_spec("gpu0 (Matrox G200)") is None
    assert match_power_spec("NVIDIA H100 NVL") is None  # a 400 W part the catalogue lacks: no borrowed SXM figures
