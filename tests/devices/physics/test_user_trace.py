"""A user's own measured power-limit sweep (Zeus CSV columns) becomes a calibrated model; a bad file is one
ConfigError line naming the file, the row (header = row 1) and the column."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.gpu_model import CalibratedModel, load_model
from dtpo.devices.physics.traces import load_traces, trace_csv_rows
from dtpo.devices.physics.user_trace import describe_trace, load_trace_file, pick_trace, read_trace_file

ZEUS_HEADER = "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power"
IMAGENET = 1_281_167

# A made-up H100 sweep: faster and hungrier as the limit rises, flattening out towards 700 W.
H100_ROWS = [(200, 120.0, 195.0), (250, 96.0, 240.0), (300, 82.0, 285.0), (350, 74.0, 330.0), (400, 69.0, 372.0),
             (450, 66.0, 410.0), (500, 64.0, 445.0), (550, 63.0, 470.0), (600, 62.5, 490.0), (650, 62.2, 500.0),
             (700, 62.0, 505.0)]


def a40_rows() -> list[dict[str, str]]:
    """The shipped A40 rows of resnet50/ImageNet at batch 256."""
    return [r for r in trace_csv_rows("A40")
            if (r["network"], r["dataset"], r["batch_size"]) == ("resnet50", "imagenet", "256")]


def write_a40_copy(tmp_path: Path, name: str = "a40_sweep.csv") -> Path:
    """A few rows of the shipped A40 file, with a samples_per_epoch column added."""
    lines = [ZEUS_HEADER + ",samples_per_epoch"]
    for r in a40_rows():
        lines.append(",".join(r[c] for c in ZEUS_HEADER.split(",")) + f",{IMAGENET}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def write_h100(tmp_path: Path, name: str = "h100_sweep.csv", rows: list[tuple[int, float, float]] = H100_ROWS) -> Path:
    path = tmp_path / name
    path.write_text("power_limit,time_per_epoch,average_power,samples_per_epoch\n"
                    + "".join(f"{limit},{time},{power},50000\n" for limit, time, power in rows))
    return path


def test_a_copy_of_a40_rows_reproduces_every_measured_point(tmp_path: Path) -> None:
    path = write_a40_copy(tmp_path)
    [trace] = load_trace_file(path, "A40")
    assert (trace.gpu, trace.workload, trace.batch_size, trace.optimizer) == ("A40", "resnet50/imagenet", 256,
                                                                              "adadelta")
    assert trace.samples_per_epoch == IMAGENET and trace.source == str(path)
    model = CalibratedModel(trace)
    shipped = load_model("A40", "resnet50", 256)
    for row in a40_rows():
        limit = float(row["power_limit"])
        point = model.at(limit)
        assert point.time_per_sample_s * IMAGENET == pytest.approx(float(row["time_per_epoch"]), rel=1e-12)
        assert point.power_w == pytest.approx(float(row["average_power"]), rel=1e-12)
        assert point == shipped.at(limit)  # the same curve as the shipped trace
    text = " ".join(model.assumptions)
    assert str(path) in text and "Zeus" not in text


def test_an_h100_sweep_from_200_to_700_w_is_a_calibrated_model(tmp_path: Path) -> None:
    path = write_h100(tmp_path)
    [trace] = load_trace_file(path, "h100")
    assert trace.gpu == "H100-SXM" and trace.workload == "custom/h100_sweep" and trace.batch_size == 1
    assert trace.optimizer == "unspecified"
    model = CalibratedModel(trace)
    assert model.spec.name == "H100-SXM" and model.calibrated
    for limit, time, power in H100_ROWS:
        point = model.at(limit)
        assert point.time_per_sample_s * 50_000 == pytest.approx(time, rel=1e-12)
        assert point.power_w == pytest.approx(power, rel=1e-12)
    middle = model.at(275)
    assert 82.0 < middle.time_per_sample_s * 50_000 < 96.0 and 240.0 < middle.power_w < 285.0
    assert model.at(None) == model.at(700)
    locked = model.at(700, 1200)
    assert locked.sm_clock_mhz <= 1200 and locked.time_per_sample_s > model.at(700).time_per_sample_s
    assert str(path) in " ".join(model.assumptions)
    assert load_trace_file(path, "H100-SXM", batch_size=64)[0].batch_size == 64  # no batch_size column


def test_a_sweep_short_of_the_range_is_extended_by_the_physical_model(tmp_path: Path) -> None:
    path = write_h100(tmp_path, rows=H100_ROWS[2:9])  # 300-600 W of 200-700 W
    model = CalibratedModel(load_trace_file(path, "H100-SXM")[0])
    low, first = model.at(200), model.at(300)
    assert low.time_per_sample_s > first.time_per_sample_s and low.power_w < first.power_w
    assert model.at(700).time_per_sample_s <= model.at(600).time_per_sample_s
    assert "outside them" in " ".join(model.assumptions)


def test_a_known_dataset_needs_no_epoch_size_and_the_whole_zeus_file_reads(tmp_path: Path) -> None:
    rows = trace_csv_rows("V100")
    path = tmp_path / "v100_copy.csv"
    path.write_text(ZEUS_HEADER + "\n" + "".join(",".join(r[c] for c in ZEUS_HEADER.split(",")) + "\n" for r in rows))
    traces = load_trace_file(path, "V100")
    shipped = load_traces("V100", all_optimizers=True)
    assert [(t.workload, t.batch_size, t.optimizer, t.points) for t in traces] == \
           [(t.workload, t.batch_size, t.optimizer, t.points) for t in shipped]
    assert all(t.samples_per_epoch is None for t in traces)
    with pytest.raises(ConfigError, match="2 traces that match; choose one .*/adadelta batch 1024; .*/adam batch 1024"):
        pick_trace(traces, "shufflenetv2", 1024)
    picked = pick_trace(traces, "shufflenetv2/cifar100/adam", 1024)
    assert picked.optimizer == "adam" and picked.batch_size == 1024
    with pytest.raises(ConfigError, match="no trace of resnet50/imagenet at batch size 7 .* measured batch sizes"):
        pick_trace(traces, "resnet50/imagenet", 7)
    with pytest.raises(ConfigError, match="no trace of workload 'tetris'"):
        pick_trace(traces, "tetris")
    assert "--workload shufflenetv2/cifar100/adam" in describe_trace(picked)


def test_rows_are_grouped_into_traces_by_workload(tmp_path: Path) -> None:
    path = tmp_path / "two.csv"
    path.write_text("network,batch_size,power_limit,time_per_epoch,average_power,samples_per_epoch\n"
                    "gpt,8,200,10,190,1000\ngpt,8,400,8,350,1000\n\n"
                    "gpt,16,400,7,380,1000\ngpt,16,200,9,195,1000\n")
    traces = load_trace_file(path, "H100-SXM")
    assert [(t.workload, t.batch_size, t.power_limits_w) for t in traces] == [
        ("gpt/two", 8, (200.0, 400.0)), ("gpt/two", 16, (200.0, 400.0))]
    with pytest.raises(ConfigError, match=r"gpt/two/unspecified batch 8; gpt/two/unspecified batch 16"):
        pick_trace(traces)
    assert pick_trace(traces, "gpt", 16).batch_size == 16


HEADER = "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power"
GOOD = "cifar100,shufflenetv2,1024,adadelta"


def rows(*lines: str) -> str:
    return "\n".join((HEADER, *lines)) + "\n"


BAD_FILES = [
    ("missing column", "dataset,power_limit,time_per_epoch\ncifar100,100,20\n",
     ["row 1", "missing column average_power", "found: dataset, power_limit, time_per_epoch"]),
    ("two missing", "power_limit\n100\n", ["row 1", "missing columns time_per_epoch, average_power"]),
    ("semicolons", "power_limit;time_per_epoch;average_power\n100;20;100\n", ["row 1", "another character"]),
    ("empty", "", ["row 1", "the file is empty"]),
    ("blank", "\n\n  \n", ["row 1", "the file is empty"]),
    ("header only", HEADER + "\n", ["row 2", "no measurements"]),
    ("not a number", rows(f"{GOOD},100,20,110", f"{GOOD},125,abc,120"),
     ["row 3, column time_per_epoch", "'abc' is not a number"]),
    ("empty cell", rows(f"{GOOD},100,20,110", f"{GOOD},125,,120"), ["row 3, column time_per_epoch", "empty"]),
    ("nan", rows(f"{GOOD},100,20,nan"), ["row 2, column average_power", "not a finite number"]),
    ("inf", rows(f"{GOOD},100,20,110", f"{GOOD},125,inf,120"), ["row 3, column time_per_epoch", "finite"]),
    ("zero", rows(f"{GOOD},100,20,110", f"{GOOD},125,0,120"), ["row 3, column time_per_epoch", "must be > 0"]),
    ("negative", rows(f"{GOOD},-100,20,110"), ["row 2, column power_limit", "must be > 0, got -100"]),
    ("duplicate", rows(f"{GOOD},100,20,110", f"{GOOD},150,15,140", f"{GOOD},100,21,111"),
     ["row 4, column power_limit", "100 W appears twice", "rows 2 and 4"]),
    ("one limit", rows(f"{GOOD},100,20,110", "cifar100,shufflenetv2,512,adadelta,100,20,110",
                       f"{GOOD},150,15,140"),
     ["row 3, column power_limit", "batch 512", "has one power limit", "at least 2"]),
    ("out of range", rows(f"{GOOD},100,20,110", f"{GOOD},350,15,140"),
     ["row 3, column power_limit", "350 W is outside the A40's power-limit range 100-300 W",
      "Leave --gpu out to take the range from the trace"]),
    ("two gpus", "gpu,power_limit,time_per_epoch,average_power,samples_per_epoch\nA40,100,20,110,50\n"
                 "a40,150,15,140,50\nNVIDIA A40,200,12,180,50\n",
     ["row 4, column gpu", "'NVIDIA A40' differs from 'A40' in row 2", "one GPU model"]),
    ("unknown dataset", rows(f"{GOOD},100,20,110", "mydata,net,8,sgd,100,20,110", f"{GOOD},150,15,140",
                             "mydata,net,8,sgd,200,10,190"),
     ["row 3, column dataset", "'mydata'", "add a samples_per_epoch column"]),
    ("fractional batch", rows("cifar100,shufflenetv2,12.5,adadelta,100,20,110"),
     ["row 2, column batch_size", "whole number"]),
    ("too many values", rows(f"{GOOD},100,20,110", f"{GOOD},150,15,140,99"), ["row 3:", "8 values", "7 columns"]),
    ("row ends early", rows(f"{GOOD},100,20,110", f"{GOOD},150,15"), ["row 3, column average_power", "ends early"]),
    ("repeated column", "power_limit,time_per_epoch,average_power,power_limit\n",
     ["row 1, column power_limit", "appears twice"]),
    ("two epoch sizes", "power_limit,time_per_epoch,average_power,samples_per_epoch\n100,20,110,50\n150,15,140,60\n",
     ["row 3, column samples_per_epoch", "differs from 50 in row 2"]),
    ("binary", "power_limit,time_per_epoch,average_power\n100,2\x000,110\n", ["row 2", "not a CSV"]),
    ("unterminated quote", 'power_limit,time_per_epoch,average_power\n100,20,110\n"150,15,140\n',
     ["row 3, column power_limit", "not a number"]),
]


@pytest.mark.parametrize(("content", "fragments"), [(c, f) for _, c, f in BAD_FILES], ids=[n for n, _, _ in BAD_FILES])
def test_a_bad_file_is_one_line_naming_row_and_column(tmp_path: Path, content: str, fragments: list[str]) -> None:
    path = tmp_path / "sweep.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_trace_file(path, "A40")
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{path} row "), message
    for fragment in fragments:
        assert fragment in message, message


def test_unreadable_files_and_unknown_gpus_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^cannot read trace file .*missing\.csv: No such file"):
        load_trace_file(tmp_path / "missing.csv", "A40")
    with pytest.raises(ConfigError, match="^cannot read trace file .*: Is a directory"):
        load_trace_file(tmp_path, "A40")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"power_limit,time_per_epoch,average_power\n100,20,110\n150,15,140 \xb0C\n")
    with pytest.raises(ConfigError, match=r"latin\.csv row 3: not UTF-8 text \(byte 0xb0\)"):
        load_trace_file(latin, "A40")
    good = write_h100(tmp_path)
    with pytest.raises(ConfigError, match="unknown GPU model 'Z9000'"):
        load_trace_file(good, "Z9000")
    with pytest.raises(ConfigError, match="batch size must be a positive integer"):
        load_trace_file(good, "H100-SXM", batch_size=0)


def test_a_bom_spaces_case_and_crlf_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeff Power_Limit , Time_Per_Epoch,AVERAGE_POWER,Samples_Per_Epoch\r\n"
                     "100, 20 ,110,1000\r\n,,,\r\n150,15,140,1000\r\n".encode())
    [trace] = load_trace_file(path, "A40")
    assert trace.power_limits_w == (100.0, 150.0) and trace.samples_per_epoch == 1000


def write_p100(tmp_path: Path, gpu: str | None = None, name: str = "p100_sweep.csv") -> Path:
    """A made-up P100 PCIe sweep over its whole 125-250 W range, optionally with a gpu column."""
    path = tmp_path / name
    lines = [("gpu," if gpu is not None else "") + "power_limit,time_per_epoch,average_power,samples_per_epoch"]
    for limit in range(125, 251, 25):
        lines.append(("" if gpu is None else f"{gpu},") + f"{limit},{30 + 3000 / limit:.2f},{0.85 * limit:.1f},50000")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trace_of_an_unnamed_gpu_takes_its_own_power_limit_range(tmp_path: Path) -> None:
    path = write_p100(tmp_path)
    read = read_trace_file(path)
    assert read.spec.from_trace and read.spec.name == "unlisted-125-250W"
    assert (read.spec.min_power_w, read.spec.max_power_w) == (125.0, 250.0)  # not the A40's 100-300 W
    assert read.note is not None and "\n" not in read.note
    assert "GPU model not named" in read.note and "power-limit range 125-250 W taken from the trace" in read.note
    [trace] = read.traces
    assert trace.gpu == "unlisted-125-250W" and load_trace_file(path, None) == [trace]
    model = CalibratedModel(trace)
    assert model.spec == read.spec and model.at(None).power_limit_w == 250.0
    with pytest.raises(ConfigError, match="outside unlisted-125-250W's range 125-250 W"):
        model.at(100.0)
    assert read_trace_file(path, "P100").note is None  # named: no note, the catalogue's spec
    assert read_trace_file(path, "P100").spec.name == "P100-PCIe"


@pytest.mark.parametrize(("column", "name", "said"), [
    ("Tesla P100-PCIE-16GB", "P100-PCIe", "GPU P100-PCIe, as the gpu column of"),
    ("p100", "P100-PCIe", "('p100')"),
    ("Tesla K80", "unlisted-125-250W", "GPU model 'Tesla K80' (the gpu column of"),
])
def test_the_gpu_column_names_the_gpu(tmp_path: Path, column: str, name: str, said: str) -> None:
    read = read_trace_file(write_p100(tmp_path, column))
    assert read.spec.name == name and read.note is not None and said in read.note
    assert read_trace_file(write_p100(tmp_path, column), "V100").spec.name == "V100"  # the caller wins


def test_a_sweep_beyond_the_named_or_column_gpus_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"row 2, column power_limit: 125 W is outside the T4's power-limit range "
                                          r"60-70 W \(the GPU the file's gpu column names \('Tesla T4'\)"):
        read_trace_file(write_p100(tmp_path, "Tesla T4"))
    with pytest.raises(ConfigError, match=r"row 2, column power_limit: 125 W is outside the H100-PCIe's power-limit "
                                          r"range 200-350 W \(is H100-PCIe the GPU .* Leave --gpu out"):
        read_trace_file(write_p100(tmp_path), "h100-pcie")
