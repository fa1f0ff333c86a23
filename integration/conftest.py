"""Helpers of the integration checks: real parts (a Prometheus server, headless Chromium, concurrent dtpo runs).

These checks start real programs and wait on them; ``make integration`` installs what they need (Debian's
``prometheus`` and ``chromium``, the ``integration`` extra) and runs them after ``make test``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "runs" / "integration"  # screenshots and logs kept for a person to look at


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dtpo_cli(*args: str) -> list[str]:
    """The command line of ``dtpo`` in this interpreter."""
    return [sys.executable, "-m", "dtpo", *args]


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    """Call ``check`` until it returns something truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)


def http_json(url: str, params: dict[str, str] | None = None, timeout_s: float = 10.0) -> Any:
    """GET ``url`` (with query ``params``) and decode its JSON body."""
    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback only
        return json.loads(response.read())


def require(program: str) -> str:
    """The path of ``program``; fails (not skips) when missing: ``make integration`` installs it."""
    path = shutil.which(program)
    if path is None:
        pytest.fail(f"{program} is not installed: run `make integration`, which installs it from Debian's packages")
    return path


@contextmanager
def started(argv: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None
            ) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` in its own process group with output in ``log``; on exit, stop the whole group."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture
def artifacts() -> Path:
    """A folder under ``runs/integration`` that outlives the test (screenshots, server logs)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(autouse=True)
def _own_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of these checks go to a store of their own, not the project's runs/dtpo.sqlite."""
    monkeypatch.setenv("DTPO_STORE", str(tmp_path_factory.getbasetemp() / "dtpo.sqlite"))
