"""``dtpo report --power-swing RUN``: the swing tables of a simulated job and of an estimated (modelled CPU) run,
a grid spec's verdicts, and one-line errors (exit 2) for what it cannot use."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dtpo.cli.report import report_command
from dtpo.core.errors import DtpoError, first_line
from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.simulation.job import JobConfig
from dtpo.simulation.power_phases import simulate_phases
from dtpo.telemetry.trace import TIMELINE_START, power_timeline_path

app = typer.Typer()
app.command("report")(report_command)
T0 = 1_800_000_000.0


@app.callback()
def _root() -> None:
    """Keep ``report`` a subcommand, as in ``dtpo``."""


def run_cli(*args: str) -> tuple[int, str]:
    """Exit code and output as ``dtpo`` gives them: a :class:`DtpoError` ends in one line and its exit code."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    if isinstance(result.exception, DtpoError):
        return result.exception.exit_code, f"dtpo: error: {first_line(str(result.exception))}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sim")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DTPO_STATE_DIR", str(folder / "state"))
        run = simulate_phases(JobConfig(gpu="H100-SXM", workload="resnet50", gpus=4, steps=30, batch_size=2048,
                                        counter_period_s=0.0))
        return run.write_run(folder / "run")


def modelled_run(folder: Path, with_power: bool = True) -> Path:
    """A one-rank CPU run whose modelled power was sampled at about 10 Hz, irregularly."""
    steps = [StepRecord(step=i, warmup=i == 0, samples=16, step_s=0.3, data_wait_s=0.01, compute_s=0.25,
                        tail_s=0.03, optimizer_s=0.01, started_at=T0 + 0.3 * i) for i in range(40)]
    rank = RankRecord(0, 0, "host", "cpu", steps=steps)
    if with_power:
        rank.energy = {TIMELINE_START: T0, "devices": [{"name": "cpu (modelled)", "kind": "cpu", "source": "modelled",
                                                        "estimated": True}]}
        path = power_timeline_path(folder, 0)
        path.parent.mkdir(parents=True)
        times = [0.1 * i + (0.25 if i > 60 else 0.0) for i in range(120)]
        path.write_text("t_s,cpu (modelled) [W]\n" + "".join(f"{t:.3f},{8 + (i % 3 == 0)}\n"
                                                               for i, t in enumerate(times)))
    RunRecord(run_id=folder.name, status="completed", started_at="now", ranks=[rank]).save(folder)
    return folder


def test_a_simulated_job_prints_its_swing_tables(simulated: Path) -> None:
    code, output = run_cli("report", "--power-swing", str(simulated), "--fleet-gpus", "4096")
    assert code == 0, output
    assert "Power swing of run (simulated)" in output
    assert "at the step rate" in output
    assert "At 4,096 GPUs" in output
    for what_if in ("power floor", "ramp limiter (GB200-like)", "energy buffer (GB300-like)", "fill communication"):
        assert what_if in output
    assert "not seen" not in output.split("What-ifs")[0]  # 50 Hz sampling resolves every band
    assert not (simulated / "report.html").exists()  # the view prints; it writes no report


def test_an_estimated_cpu_run_is_labelled_and_says_what_it_cannot_see(tmp_path: Path) -> None:
    code, output = run_cli("report", "--power-swing", str(modelled_run(tmp_path / "cpu")))
    assert code == 0, output
    assert "(estimated)" in output and "power is estimated" in output
    assert "7-20 Hz" in output and "not seen" in output
    assert "resampled" in output  # the irregular sampling is said
    assert "no GPU in this run" in output


def test_a_grid_spec_gives_verdicts(simulated: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text("band_hz = [0.1, 20.0]\nmax_band_share = 0.5\nmax_ramp_mw_per_s = 1.0\ngpus = 100000\n")
    code, output = run_cli("report", "--power-swing", str(simulated), "--grid-spec", str(spec))
    assert code == 0, output
    assert "Against the grid spec" in output and "At 100,000 GPUs" in output
    assert "fail" in output  # most of a synchronous job's swing is in the band, and 100k GPUs ramp fast


@pytest.mark.parametrize(("args", "message"), [
    (["--power-swing", "{tmp}/missing"], "does not exist"),
    (["--power-swing", "{nopower}"], "has no power timeline"),
    (["--power-swing", "{sim}", "{sim}"], "takes one run"),
    (["--power-swing", "{sim}", "--grid-spec", "{tmp}/nope.toml"], "cannot read the grid spec"),
    (["--power-swing", "{sim}", "--fleet-gpus", "0"], "fleet size"),
    (["{sim}", "--grid-spec", "{tmp}/nope.toml"], "go with --power-swing"),
], ids=["missing", "no power", "two runs", "missing spec", "zero fleet", "spec without view"])
def test_bad_input_ends_in_one_line_and_exit_2(simulated: Path, tmp_path: Path, args: list[str], message: str) -> None:
    nopower = modelled_run(tmp_path / "nopower", with_power=False)
    code, output = run_cli("report", *(a.format(tmp=tmp_path, sim=simulated, nopower=nopower) for a in args))
    assert code == 2 and message in output and "\n" not in output
