"""The packaged Zeus power-limit traces load completely and correctly."""

from __future__ import annotations

import csv
import hashlib
import io
import tomllib
from importlib import resources
from pathlib import Path

import pytest

import dtpo
from dtpo.core.errors import ConfigError
from dtpo.devices.physics.traces import ZEUS_OPTIMIZER, find_trace, load_traces, resolve_workload, trace_csv_rows

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data" / "zeus-nsdi23"
FILES = {"A40": "summary_power_a40.csv", "V100": "summary_power_v100.csv"}


def packaged(name: str) -> resources.abc.Traversable:
    return resources.files("dtpo.devices.physics") / "data" / "zeus_nsdi23" / name


def raw_rows(gpu: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(packaged(FILES[gpu]).read_text(encoding="utf-8"))))


def test_both_gpus_load() -> None:
    a40, v100, both = load_traces("A40"), load_traces("v100"), load_traces()
    assert {t.gpu for t in a40} == {"A40"} and {t.gpu for t in v100} == {"V100"}
    assert len(both) == len(a40) + len(v100)
    assert len(a40) == 53 and len(v100) == 58


@pytest.mark.parametrize("gpu, rows, kept", [("A40", 453, 453), ("V100", 476, 406)])
def test_row_counts_match_the_csv(gpu: str, rows: int, kept: int) -> None:
    csv_rows = raw_rows(gpu)
    assert len(csv_rows) == rows
    zeus_rows = [r for r in csv_rows if ZEUS_OPTIMIZER[(r["network"], r["dataset"])] == r["optimizer"]]
    assert len(zeus_rows) == kept  # the V100 file also has shufflenetv2 with adam: 10 batch sizes x 7 limits
    assert sum(len(t.points) for t in load_traces(gpu)) == kept
    assert sum(len(t.points) for t in load_traces(gpu, all_optimizers=True)) == rows


def test_points_sorted_and_energy_is_time_times_power() -> None:
    for trace in load_traces(all_optimizers=True):
        limits = trace.power_limits_w
        assert list(limits) == sorted(set(limits)), trace.label
        assert limits[0] == 100.0 and limits[-1] == {"A40": 300.0, "V100": 250.0}[trace.gpu]
        for point, energy in zip(trace.points, trace.energy_per_epoch_j, strict=True):
            assert energy == pytest.approx(point.time_per_epoch_s * point.average_power_w, rel=1e-12)
            assert point.time_per_epoch_s > 0 and point.average_power_w > 0


def test_a_known_row_and_its_optimum() -> None:
    trace = find_trace("A40", "resnet50/imagenet", 128)
    assert trace.optimizer == "adadelta"
    by_limit = {p.power_limit_w: p for p in trace.points}
    row = next(r for r in raw_rows("A40") if (r["network"], r["batch_size"], r["power_limit"]) == ("resnet50", "128",
                                                                                                   "200"))
    assert by_limit[200.0].time_per_epoch_s == float(row["time_per_epoch"])
    assert by_limit[200.0].average_power_w == float(row["average_power"])
    energies = {p.power_limit_w: p.time_per_epoch_s * p.average_power_w for p in trace.points}
    assert trace.optimal_power_limit_w == min(energies, key=energies.__getitem__) == 200.0


def test_default_batch_is_zeus_default_capped_at_what_was_measured() -> None:
    assert find_trace("A40", "resnet50").batch_size == 256
    assert find_trace("a40", "deepspeech2").batch_size == 192  # Zeus default 256, largest measured 192
    assert find_trace("V100", "bert_base_uncased/squad").batch_size == 32
    assert find_trace("V100", "shufflenetv2").optimizer == "adadelta"


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(ConfigError, match="resnet50/imagenet") as err:
        find_trace("A40", "gpt9")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="bert_base_uncased/sentiment140.*bert_base_uncased/squad"):
        resolve_workload("bert_base_uncased")
    with pytest.raises(ConfigError, match="measured batch sizes: 8, 16, 32"):
        find_trace("A40", "resnet50", 100)
    with pytest.raises(ConfigError, match="A40, V100"):
        find_trace("H100", "resnet50")


def test_packaged_data_is_used_and_attributed() -> None:
    for name in (*FILES.values(), "README.md"):
        assert packaged(name).is_file(), name
    readme = packaged("README.md").read_text(encoding="utf-8")
    assert "Apache License 2.0" in readme and "Zeus" in readme and "verbatim copy" in readme
    # The copy lives inside the dtpo package, where pyproject's package-data puts it in wheels (not in the shared
    # folder), and it is what the loader reads.
    package_dir = Path(dtpo.__file__).resolve().parent
    for name in FILES.values():
        path = Path(str(packaged(name))).resolve()
        assert path.is_relative_to(package_dir) and not path.is_relative_to(SHARED.resolve()), path
        assert any(path.relative_to(package_dir).match(glob) for glob in _package_data_globs()), path
    assert trace_csv_rows("A40") == raw_rows("A40") and trace_csv_rows("V100") == raw_rows("V100")


def _package_data_globs() -> list[str]:
    """The file patterns pyproject.toml ships with the dtpo package."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    return pyproject["tool"]["setuptools"]["package-data"]["dtpo"]


# SHA-256 of the Zeus artifact's files, checked byte for byte against ../shared/data/zeus-nsdi23/ when recorded.
ZEUS_SHA256 = {
    "summary_power_a40.csv": "f4ec111fc9b06b353182faab9160ecb1236a486b2741ed93383b80497332031e",
    "summary_power_v100.csv": "f0b066dd1a451bd78f730e001ac3a7c411979bc7f0846f12c1a9fb604aa90628",
}


def test_packaged_copy_matches_the_recorded_checksums() -> None:
    """Runs everywhere (wheel, CI, checkout): the packaged bytes are the Zeus artifact's."""
    for name, digest in ZEUS_SHA256.items():
        assert hashlib.sha256(packaged(name).read_bytes()).hexdigest() == digest, name
    manifest = dict(reversed(line.split()) for line in packaged("SHA256SUMS").read_text().splitlines() if line)
    assert manifest == ZEUS_SHA256  # the manifest shipped beside the data says the same


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared checkout beside this repository")
def test_packaged_copy_is_verbatim() -> None:
    for name in FILES.values():
        assert packaged(name).read_bytes() == (SHARED / name).read_bytes(), name
