"""The HTML report opens in headless Chromium with no console errors, its plots drawn; a screenshot is kept."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import dtpo_cli, require

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def _train(run_dir: Path, *extra: str) -> None:
    done = subprocess.run(dtpo_cli("train", "--workload", "mlp", "--workers", "2", "--steps", "40",
                                   "--run-dir", str(run_dir), *extra), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def _open(html: Path, screenshot: Path) -> tuple[list[str], int, int]:
    """Load ``html`` in Chromium: its console errors and page errors, figures, and drawn SVG elements."""
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=require("chromium"), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto(html.as_uri(), wait_until="load")
            figures = page.locator("figure").count()
            # A figure is drawn when its inline SVG holds shapes and has a size on the page.
            drawn = page.evaluate("""() => [...document.querySelectorAll('figure svg')].filter(svg => {
                const box = svg.getBoundingClientRect();
                return box.width > 50 && box.height > 50 && svg.querySelectorAll('path, rect, line').length > 3;
            }).length""")
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return problems, figures, drawn


def test_a_run_report_and_a_comparison_open_cleanly_with_their_plots_drawn(tmp_path: Path, artifacts: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _train(first)
    _train(second, "--grad-accum", "2")
    report = first / "report.html"
    assert report.is_file(), "dtpo train did not write report.html"
    problems, figures, drawn = _open(report, artifacts / "report.png")
    assert not problems, problems
    assert figures >= 4 and drawn == figures, (figures, drawn)
    both = tmp_path / "both.html"
    done = subprocess.run(dtpo_cli("report", str(first), str(second), "--out", str(both)), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    problems, figures, drawn = _open(both, artifacts / "report-compare.png")
    assert not problems, problems
    assert figures > 4 and drawn == figures, (figures, drawn)
    assert (artifacts / "report.png").stat().st_size > 10_000
