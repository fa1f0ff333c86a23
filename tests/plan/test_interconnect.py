"""The link catalogue: figures, aliases, efficiency and the error for an unknown link."""

from __future__ import annotations

import pytest

from dtpo.core.errors import ConfigError
from dtpo.plan.interconnect import CATALOGUE, Link, find_link, link_names, node_bandwidth


def test_the_catalogue_holds_the_expected_links_in_bytes_per_second() -> None:
    assert link_names() == ["nvlink3", "nvlink4", "nvlink1", "pcie3", "pcie4", "pcie5", "ib-hdr", "ib-ndr",
                            "roce-100g", "roce-200g", "roce-400g", "eth-25g-tcp", "nvlink2", "ib-edr", "xgmi-mi300x",
                            "loopback"]
    expected = {"nvlink1": 80e9, "nvlink2": 150e9, "ib-edr": 12.5e9, "pcie3": 16e9, "nvlink3": 300e9,
                "nvlink4": 450e9, "pcie4": 32e9, "pcie5": 64e9,
                "ib-hdr": 25e9, "ib-ndr": 50e9, "roce-100g": 12.5e9, "eth-25g-tcp": 3.125e9, "xgmi-mi300x": 448e9,
                "roce-200g": 25e9, "roce-400g": 50e9}
    for name, bandwidth in expected.items():
        assert find_link(name).bus_bandwidth_Bps == pytest.approx(bandwidth)
    assert find_link("pcie4").effective_bandwidth_Bps == pytest.approx(25e9)
    assert find_link("pcie5").effective_bandwidth_Bps == pytest.approx(50e9)
    assert find_link("xgmi-mi300x").effective_bandwidth_Bps == pytest.approx(7 * 48e9)  # 48 GB/s usable per link
    assert {find_link(n).kind for n in ("ib-edr", "ib-hdr", "ib-ndr", "roce-100g", "eth-25g-tcp")} == {"inter"}
    assert {find_link(n).kind for n in ("nvlink2", "nvlink3", "nvlink4", "pcie4", "pcie5", "loopback")} == {"intra"}


def test_every_entry_says_where_its_figures_come_from_and_why_its_efficiency() -> None:
    for link in CATALOGUE.values():
        assert link.source and link.note
        assert 0 < link.efficiency <= 1
        assert link.name == link.name.lower()
    assert "placeholder" in find_link("loopback").source
    latency = {name: find_link(name).latency_s for name in ("nvlink4", "ib-ndr", "roce-100g", "eth-25g-tcp")}
    assert latency["nvlink4"] < latency["ib-ndr"] < latency["roce-100g"] < latency["eth-25g-tcp"]
    assert find_link("eth-25g-tcp").efficiency < find_link("ib-ndr").efficiency


@pytest.mark.parametrize(("alias", "name"), [("NVLink4", "nvlink4"), ("IB_HDR", "ib-hdr"), (" HDR ", "ib-hdr"),
                                             ("ndr", "ib-ndr"), ("RoCE", "roce-100g"), ("TCP", "eth-25g-tcp"),
                                             ("PCIe-Gen5", "pcie5"), ("SHM", "loopback"),
                                             ("xGMI", "xgmi-mi300x"), ("RoCE400", "roce-400g")])
def test_aliases_are_accepted_in_any_case(alias: str, name: str) -> None:
    assert find_link(alias) is CATALOGUE[name]


def test_an_unknown_link_is_named_in_one_line_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        find_link("Quantum-Foam")
    message = str(caught.value)
    assert "Quantum-Foam" in message and "\n" not in message
    assert all(name in message for name in link_names())


def test_efficiency_scales_the_effective_bandwidth() -> None:
    ndr = find_link("ib-ndr")
    slow = ndr.with_efficiency(0.5)
    assert slow.effective_bandwidth_Bps == pytest.approx(25e9)
    assert ndr.efficiency == 0.85  # the catalogue entry is unchanged (frozen)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ConfigError):
            ndr.with_efficiency(bad)
    with pytest.raises(ConfigError):
        Link("x", "sideways", 1e9, 1e-6, "test")


def test_node_bandwidth_multiplies_nics() -> None:
    ndr = find_link("ib-ndr")
    assert node_bandwidth(ndr, 8) == pytest.approx(400e9)
    assert node_bandwidth(ndr, 8, effective=True) == pytest.approx(340e9)
    assert node_bandwidth(find_link("nvlink4")) == pytest.approx(450e9)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError):
            node_bandwidth(ndr, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="intra-node"):
        node_bandwidth(find_link("nvlink4"), 2)
