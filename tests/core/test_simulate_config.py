"""dtpo simulate's configuration tree: its mode, and the rules between its flags in one line each."""

from __future__ import annotations

import math

import pytest

from dtpo.core.config_section import tree_fields
from dtpo.core.errors import ConfigError
from dtpo.core.simulate_config import SimulateConfig, parse_stragglers


@pytest.mark.parametrize("sections, mode", [
    ({}, "setting"),
    ({"knobs": {"power_limit_w": 200}}, "setting"),
    ({"knobs": {"sweep": "sm-clock"}}, "sweep"),
    ({"tune": {"knob": "both"}}, "tune"),
    ({"tune": {"knob": "stragglers"}, "stragglers": {"straggler": "1:1.2,2:1.1"}}, "stragglers"),
    ({"output": {"list": True}, "knobs": {"sweep": "voltage"}}, "list"),  # list ignores the rest
])
def test_the_tree_says_its_mode(sections: dict, mode: str) -> None:
    assert SimulateConfig.from_dict(sections).mode == mode


@pytest.mark.parametrize("sections, message", [
    ({"job": {"model": "exact"}}, r"^--model must be one of auto, calibrated, parametric, got 'exact'$"),
    ({"job": {"model": "parametric", "trace": "t.csv"}}, r"^--model parametric cannot use --trace"),
    ({"job": {"noise": math.nan}}, r"^--noise must be a finite number, got nan$"),
    ({"job": {"counter_period": math.inf}}, r"^--counter-period must be a finite number, got inf$"),
    ({"knobs": {"sweep": "voltage"}}, r"^--sweep must be one of power-limit, sm-clock, got 'voltage'$"),
    ({"knobs": {"sweep": "sm-clock", "sm_clock_mhz": 1200}}, r"^--sweep sm-clock already sets that knob"),
    ({"tune": {"knob": "voltage"}}, r"^--tune must be one of power-limit, sm-clock, both, got 'voltage'"),
    ({"tune": {"knob": "both"}, "knobs": {"power_limit_w": 200}}, r"^--tune chooses the settings itself"),
    ({"tune": {"knob": "both", "step_w": 0}}, r"^--tune-step must be > 0 W, got 0$"),
    ({"stragglers": {"straggler": "1:1.2,2:1.1"}}, r"names 2 stragglers; only --tune stragglers simulates several"),
    ({"stragglers": {"period": 5}}, r"^--straggler-pattern and --period apply only to --tune stragglers$"),
    ({"tune": {"knob": "stragglers", "cost": "energy"}}, r"^--tune stragglers does not use --cost"),
    ({"tune": {"knob": "stragglers"}, "job": {"model": "calibrated"}}, r"picks the model itself.*drop --model$"),
    ({"tune": {"knob": "stragglers"}, "knobs": {"sweep": "power-limit"}}, r"chooses each rank's clock itself"),
    ({"tune": {"knob": "stragglers"}, "stragglers": {"straggler": "3"}}, r"^--straggler must be RANK:FACTOR"),
    ({"job": {"gpus": "8"}}, r"^job\.gpus must be an integer, got '8' \(--gpus\)$"),
])
def test_rules_between_flags_are_one_line_naming_them(sections: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SimulateConfig.from_dict(sections)


@pytest.mark.parametrize("text, parsed", [(None, ()), ("3:1.25", ((3, 1.25),)), ("3:1.2, 5:1.1", ((3, 1.2), (5, 1.1)))])
def test_stragglers_parse(text: str | None, parsed: tuple) -> None:
    assert parse_stragglers(text) == parsed


@pytest.mark.parametrize("text, message", [("3:1.2,3:1.1", "names rank 3 twice"), ("1:0", "finite number > 0"),
                                           ("x:1", "RANK:FACTOR")])
def test_bad_stragglers_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_stragglers(text)


def test_every_field_is_documented_with_a_unique_flag() -> None:
    fields = tree_fields(SimulateConfig)
    assert all(f.help for f in fields)
    flags = [f.flag for f in fields]
    assert None not in flags and len(flags) == len(set(flags))


def test_paths_round_trip_as_strings() -> None:
    config = SimulateConfig.from_dict({"job": {"trace": "my.csv"}, "output": {"json": "out.json"}})
    data = config.to_dict()
    assert data["job"]["trace"] == "my.csv" and data["output"]["json"] == "out.json"
    assert SimulateConfig.from_dict(data) == config
