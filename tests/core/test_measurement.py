"""A measurement never holds NaN or infinity, and reads like its JSON form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dtpo.core.measurement import Measurement, measurement_or_none


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float64("nan")])
def test_non_finite_values_become_unknown_with_a_note(bad: float) -> None:
    m = Measurement(bad, "J", "measured", "from rapl")
    assert m.value is None and not m.known
    assert m.note.startswith("from rapl; not a finite number")
    assert Measurement.from_dict({"value": bad, "unit": "J"}).value is None  # also when loaded


def test_finite_values_are_kept_as_given() -> None:
    assert Measurement(3, "steps").value == 3
    assert Measurement(np.float32(0.5), "fraction").value == 0.5
    assert Measurement(None, "W", note="lost").note == "lost"


def test_bad_sources_and_values_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown measurement source 'guessed'"):
        Measurement(1.0, "J", "guessed")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a number"):
        Measurement("12", "J")  # type: ignore[arg-type]


def test_round_trip_and_json_style_access() -> None:
    m = Measurement(2.0, "W", "estimated", "modelled")
    assert Measurement.from_dict(m.to_dict()) == m
    assert m.to_dict() == {"value": 2.0, "unit": "W", "source": "estimated", "note": "modelled"}
    assert "note" not in Measurement(1.0, "W").to_dict()
    assert m["value"] == 2.0 and m.get("note") == "modelled" and Measurement(1.0, "W").get("note", "-") == "-"
    with pytest.raises(KeyError):
        m["nope"]
    assert measurement_or_none(None) is None and measurement_or_none(m) is m
    assert measurement_or_none(m.to_dict()) == m
