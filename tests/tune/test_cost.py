"""Cost metrics: each against numbers worked out by hand, the slowdown constraint at its edge, and every form
(good and bad) of ``--cost``."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from dtpo.core.errors import ConfigError
from dtpo.tune.cost import COST_FORMS, CostContext, Dollars, Energy, MaxSlowdown, Time, ZeusCost, parse_cost

T = 0.25  # seconds per sample
E = 180.0  # joules per sample (all GPUs)


def test_energy_and_time_pick_one_figure() -> None:
    ctx = CostContext(gpus=8, max_power_w=700.0)
    assert Energy().per_sample(T, E, ctx) == E
    assert Time().per_sample(T, E, ctx) == T
    assert Energy().weights(ctx) == (0.0, 1.0) and Time().weights(ctx) == (1.0, 0.0)
    assert Energy().feasible(10 * T, T) and Time().feasible(10 * T, T)


def test_zeus_cost_weighs_energy_against_max_power_of_every_gpu() -> None:
    ctx = CostContext(gpus=2, max_power_w=300.0)
    # 0.5 * E + 0.5 * (300 W * 2 GPUs) * T
    assert ZeusCost(0.5).per_sample(T, E, ctx) == pytest.approx(0.5 * 180.0 + 0.5 * 600.0 * 0.25)
    assert ZeusCost(0.5).per_sample(T, E, ctx) == pytest.approx(165.0)
    assert ZeusCost(1.0).per_sample(T, E, ctx) == pytest.approx(180.0)  # energy only
    assert ZeusCost(0.0).per_sample(T, E, ctx) == pytest.approx(150.0)  # max power times time only
    assert ZeusCost(0.2).weights(ctx) == pytest.approx((0.8 * 600.0, 0.2))
    assert ZeusCost(0.5).name == "zeus:0.5"


def test_zeus_cost_needs_the_max_power() -> None:
    with pytest.raises(ConfigError, match="maximum power limit"):
        ZeusCost(0.5).per_sample(T, E, CostContext(gpus=1, max_power_w=0.0))


def test_dollars_are_the_energy_bill_plus_the_rental() -> None:
    ctx = CostContext(gpus=4, max_power_w=400.0)
    expected = 180.0 / 3.6e6 * 0.15 + 0.25 * 4 / 3600 * 2.5
    assert Dollars(0.15, 2.5).per_sample(T, E, ctx) == pytest.approx(expected)
    assert expected == pytest.approx(7.5e-6 + 6.944444e-4)
    assert Dollars(0.15, 0.0).per_sample(T, E, ctx) == pytest.approx(7.5e-6)
    assert Dollars(0.0, 2.5).per_sample(T, E, ctx) == pytest.approx(6.944444e-4)
    assert Dollars(0.15, 2.5).name == "dollars:0.15,2.5"


def test_max_slowdown_minimises_energy_and_allows_exactly_the_factor() -> None:
    metric = MaxSlowdown(1.1)
    ctx = CostContext(gpus=1, max_power_w=300.0)
    assert metric.per_sample(T, E, ctx) == E
    default_t = 0.2
    assert metric.feasible(default_t, default_t)
    assert metric.feasible(0.5 * default_t, default_t)  # faster is always allowed
    assert metric.feasible(1.1 * default_t, default_t)  # exactly at the factor
    assert not metric.feasible(1.1 * default_t * (1 + 1e-9), default_t)
    assert not metric.feasible(1.2 * default_t, default_t)
    assert MaxSlowdown(1.0).feasible(default_t, default_t)
    assert not MaxSlowdown(1.0).feasible(default_t * (1 + 1e-9), default_t)


@pytest.mark.parametrize(("text", "kind", "name"), [
    ("energy", Energy, "energy"),
    ("time", Time, "time"),
    ("  Energy ", Energy, "energy"),
    ("TIME", Time, "time"),
    ("zeus:0.5", ZeusCost, "zeus:0.5"),
    ("zeus:0", ZeusCost, "zeus:0"),
    ("zeus:1", ZeusCost, "zeus:1"),
    ("ZEUS:0.25", ZeusCost, "zeus:0.25"),
    ("slowdown:1.1", MaxSlowdown, "slowdown:1.1"),
    ("slowdown:1", MaxSlowdown, "slowdown:1"),
    ("dollars:0.15,2.5", Dollars, "dollars:0.15,2.5"),
    ("dollars:0,2.5", Dollars, "dollars:0,2.5"),
    ("dollars:0.3,0", Dollars, "dollars:0.3,0"),
])
def test_parse_cost_reads_every_form(text: str, kind: type, name: str) -> None:
    metric = parse_cost(text)
    assert isinstance(metric, kind) and metric.name == name
    assert parse_cost(metric.name).name == metric.name  # the name is a valid --cost again


def test_parsed_parameters_arrive() -> None:
    zeus = parse_cost("zeus:0.3")
    assert isinstance(zeus, ZeusCost) and zeus.eta == 0.3
    slow = parse_cost("slowdown:1.25")
    assert isinstance(slow, MaxSlowdown) and slow.factor == 1.25
    dollars = parse_cost("dollars:0.12,3.5")
    assert isinstance(dollars, Dollars) and (dollars.price_per_kwh, dollars.price_per_gpu_hour) == (0.12, 3.5)


@pytest.mark.parametrize(("text", "match"), [
    # unknown names, and known names in the wrong shape
    ("", "unknown cost metric"),
    ("power", "unknown cost metric"),
    ("energy:1", "unknown cost metric"),
    ("time:2", "unknown cost metric"),
    ("zeus", "unknown cost metric"),
    ("slowdown", "unknown cost metric"),
    ("dollars", "unknown cost metric"),
    ("edp:0.5", "unknown cost metric"),
    # zeus: eta in [0, 1], a number
    ("zeus:1.5", "eta must be between 0 and 1"),
    ("zeus:-0.1", "eta must be between 0 and 1"),
    ("zeus:nan", "eta must be between 0 and 1"),
    ("zeus:inf", "eta must be between 0 and 1"),
    ("zeus:", "eta must be a number"),
    ("zeus:half", "eta must be a number"),
    # slowdown: a factor >= 1, a number
    ("slowdown:0.9", "slowdown factor must be >= 1"),
    ("slowdown:0", "slowdown factor must be >= 1"),
    ("slowdown:-2", "slowdown factor must be >= 1"),
    ("slowdown:nan", "slowdown factor must be >= 1"),
    ("slowdown:inf", "slowdown factor must be >= 1"),
    ("slowdown:10%", "slowdown factor must be a number"),
    # dollars: two prices separated by a comma, both numbers >= 0, not both 0
    ("dollars:0.15", "write dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR"),
    ("dollars:0.15;2.5", "write dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR"),
    ("dollars:", "write dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR"),
    ("dollars:cheap,2.5", "the price per kWh must be a number"),
    ("dollars:0.15,dear", "the price per GPU-hour must be a number"),
    ("dollars:,2.5", "the price per kWh must be a number"),
    ("dollars:0.15,", "the price per GPU-hour must be a number"),
    ("dollars:0.15,2.5,1", "the price per GPU-hour must be a number"),
    ("dollars:-0.15,2.5", "price per kWh must be a finite number >= 0"),
    ("dollars:0.15,-1", "price per GPU-hour must be a finite number >= 0"),
    ("dollars:nan,2.5", "price per kWh must be a finite number >= 0"),
    ("dollars:0.15,inf", "price per GPU-hour must be a finite number >= 0"),
    ("dollars:0,0", "both prices are 0"),
])
def test_bad_cost_forms_are_one_line_config_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        parse_cost(text)
    message = str(info.value)
    assert message and "\n" not in message


def test_an_unknown_name_lists_every_form() -> None:
    with pytest.raises(ConfigError) as info:
        parse_cost("joules")
    assert "'joules'" in str(info.value) and COST_FORMS in str(info.value)


@pytest.mark.parametrize("make", [
    lambda: ZeusCost(2.0), lambda: ZeusCost(math.nan), lambda: MaxSlowdown(0.5), lambda: MaxSlowdown(math.inf),
    lambda: Dollars(-1.0, 1.0), lambda: Dollars(0.1, math.nan), lambda: Dollars(0.0, 0.0),
])
def test_constructors_refuse_bad_parameters(make: Callable[[], object]) -> None:
    with pytest.raises(ConfigError):
        make()
