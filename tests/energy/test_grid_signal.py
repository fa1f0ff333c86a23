"""Grid signals: each file shape read into g CO2e/kWh or a price per kWh; bad input is one ConfigError line."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.energy.grid_signal import (
    CARBON_UNIT,
    GRAMS_PER_POUND,
    load_grid_signal,
    load_grid_signals,
    parse_unit,
    synthetic_diurnal,
)

SHIPPED = Path(__file__).parents[2] / "benchmarks" / "data" / "uk_carbon_intensity_2023-03-14_19.csv"


def write(tmp_path: Path, name: str, text: str | object) -> Path:
    path = tmp_path / name
    path.write_text(text if isinstance(text, str) else json.dumps(text))
    return path


def test_a_plain_csv_defaults_to_carbon_and_keeps_times_in_utc(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", "time,value\n2024-01-01T00:00Z,100\n2024-01-01T02:00+01:00,120\n"
                                    "2024-01-01T02:00,90\n")
    signal = load_grid_signal(path)
    assert signal.unit == CARBON_UNIT and signal.kind == "actual" and signal.interval_s == 3600
    assert list(signal.values) == [100, 120, 90]
    assert signal.times[1:] == (datetime(2024, 1, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, 2, tzinfo=UTC))


def test_a_price_header_is_converted_to_per_kwh(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", "time,EUR/MWh\n2024-01-01T00:00Z,80\n2024-01-01T00:15Z,120\n")
    signal = load_grid_signal(path)
    assert signal.unit == "EUR/kWh" and list(signal.values) == pytest.approx([0.08, 0.12])
    assert signal.interval_s == 900 and not signal.is_carbon and signal.per_kwh_name == "EUR"


def test_the_shipped_trace_has_forecast_and_actual_half_hours() -> None:
    signals = load_grid_signals(SHIPPED)
    assert set(signals) == {"forecast", "actual"}
    actual = signals["actual"]
    assert len(actual) == 244 and actual.interval_s == 1800 and actual.like(signals["forecast"])
    assert actual.start == datetime(2023, 3, 14, 1, tzinfo=UTC) and 50 < actual.values.min() < actual.values.max() < 300


def test_watttime_v3_forecast_in_pounds_per_mwh(tmp_path: Path) -> None:
    data = {"meta": {"region": "CAISO_NORTH", "signal_type": "co2_moer", "units": "lbs_co2_per_mwh",
                     "generated_at": "2024-05-01T00:00:00+00:00"},
            "data": [{"point_time": "2024-05-01T00:00:00+00:00", "value": 1000.0, "version": "1"},
                     {"point_time": "2024-05-01T00:05:00+00:00", "value": 500.0, "version": "1"}]}
    signal = load_grid_signal(write(tmp_path, "wt.json", data))
    assert signal.kind == "forecast" and signal.interval_s == 300 and "WattTime" in signal.source
    assert list(signal.values) == pytest.approx([GRAMS_PER_POUND, GRAMS_PER_POUND / 2])


def test_electricity_maps_v3_history(tmp_path: Path) -> None:
    data = {"zone": "DE", "history": [
        {"zone": "DE", "carbonIntensity": 322, "datetime": "2024-05-01T00:00:00.000Z", "isEstimated": False,
         "emissionFactorType": "lifecycle"},
        {"zone": "DE", "carbonIntensity": 300, "datetime": "2024-05-01T01:00:00.000Z", "isEstimated": True,
         "emissionFactorType": "lifecycle"}]}
    signal = load_grid_signal(write(tmp_path, "em.json", data))
    assert signal.kind == "actual" and list(signal.values) == [322, 300] and "Electricity Maps" in signal.source


def test_uk_api_json_gives_both_kinds_and_drops_unpublished_actuals(tmp_path: Path) -> None:
    data = {"data": [{"from": f"2024-05-01T0{h}:00Z", "to": "x",
                      "intensity": {"forecast": 100 + h, "actual": None if h == 3 else 90 + h, "index": "low"}}
                     for h in range(4)]}
    signals = load_grid_signals(write(tmp_path, "uk.json", data))
    assert list(signals["forecast"].values) == [100, 101, 102, 103]
    assert list(signals["actual"].values) == [90, 91, 92]


def test_a_gap_is_bridged_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "g.csv", "time,value\n2024-01-01T00:00Z,100\n2024-01-01T00:30Z,110\n"
                                   "2024-01-01T02:00Z,90\n")
    with caplog.at_level(logging.WARNING):
        signal = load_grid_signal(path)
    assert list(signal.values) == [100, 110, 110, 110, 90]
    assert "gaps" in caplog.text and "2 interval(s) before 2024-01-01T02:00Z" in caplog.text


@pytest.mark.parametrize(("text", "message"), [
    ("time,value\n2024-01-01T01:00Z,1\n2024-01-01T00:00Z,2\n", "not sorted"),
    ("time,value\n2024-01-01T00:00Z,1\n2024-01-01T00:00Z,2\n", "appears twice"),
    ("time,value [furlongs]\n2024-01-01T00:00Z,1\n2024-01-01T01:00Z,2\n", "unknown signal unit"),
    ("time,value\n2024-01-01T00:00Z,-1\n2024-01-01T01:00Z,2\n", "finite number >= 0"),
    ("time,value\nyesterday,1\n2024-01-01T01:00Z,2\n", "not an ISO 8601 time"),
    ("when,value\n2024-01-01T00:00Z,1\n", "header"),
])
def test_bad_csv_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        load_grid_signal(write(tmp_path, "bad.csv", text))
    assert "\n" not in str(error.value)


def test_an_unknown_json_shape_and_a_wrong_kind_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a signal file"):
        load_grid_signal(write(tmp_path, "x.json", {"rows": []}))
    with pytest.raises(ConfigError, match="has no forecast values"):
        load_grid_signal(write(tmp_path, "a.csv", "time,value\n2024-01-01T00:00Z,1\n2024-01-01T01:00Z,2\n"),
                         "forecast")


def test_a_signal_that_does_not_cover_the_job_is_refused() -> None:
    signal = synthetic_diurnal(datetime(2024, 1, 1, tzinfo=UTC), 1)
    signal.check_covers(signal.start, 86400)
    with pytest.raises(ConfigError, match="covers 2024-01-01T00:00Z to 2024-01-02T00:00Z"):
        signal.check_covers(signal.start, 86400 + 1800)


def test_units_and_the_synthetic_trace() -> None:
    assert parse_unit("kgCO2e/MWh") == (CARBON_UNIT, 1.0) and parse_unit("gbp/kwh") == ("GBP/kWh", 1.0)
    signal = synthetic_diurnal(datetime(2024, 1, 1, tzinfo=UTC), 2, seed=3)
    assert len(signal) == 96 and signal.values.min() >= 0 and "synthetic" in signal.source
    evening = signal.values[[38, 86]].mean()  # 19:00
    night = signal.values[[8, 56]].mean()  # 04:00
    assert evening > 1.3 * night
