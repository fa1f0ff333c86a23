"""The node's Prometheus endpoint: local rank 0 serves what every rank of the node writes.

The ranks of a node write their metrics (:class:`dtpo.telemetry.metrics.RankMetrics`) into the node's metrics
folder, ``RUN_DIR/metrics/<hostname>/``; local rank 0 prepares the folder (:func:`prepare_metrics_dir`) and
serves it with prometheus-client's ``MultiProcessCollector`` at ``--metrics-addr`` (:class:`MetricsServer`),
writing where it listens to ``endpoint.json`` in the folder while it serves (port 0 picks a free port).

``dtpo train`` checks the address with :func:`check_metrics_addr` before any worker starts, so an address in
use ends the command with one line; a worker that still cannot bind (another process took the port since)
logs a warning and trains on without the endpoint.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

from dtpo.core.config import parse_metrics_addr
from dtpo.core.errors import ConfigError

log = logging.getLogger(__name__)

METRICS_DIR = "metrics"
"""Folder of the run dir that holds one metrics folder per node."""
ENDPOINT_FILE = "endpoint.json"
"""Written into the node's metrics folder while local rank 0 serves: ``url``, ``host``, ``port``, ``pid``."""

_FILE = re.compile(r"^(?P<kind>[a-z]+)(?:_[a-z]+)?_dtpo-(?P<pid>\d+)\.db$")


def check_metrics_addr(text: str) -> tuple[str, int]:
    """Parse ``--metrics-addr`` and make sure it can be bound here, now.

    Args:
        text: ``HOST:PORT``, ``:PORT`` or ``PORT`` (host default 127.0.0.1; port 0: any free port).

    Returns:
        ``(host, port)``.

    Raises:
        ConfigError: One line: not an address, the address is in use, not one of this machine's, or the port
            needs privileges.
    """
    host, port = parse_metrics_addr(text)
    shown = f"--metrics-addr {text.strip()}"
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, IndexError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "no address"
        raise ConfigError(f"{shown}: cannot resolve host {host!r} ({reason}); give an address of this machine, "
                          "e.g. --metrics-addr 127.0.0.1:PORT") from None
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            raise ConfigError(bind_error(shown, host, exc)) from None
    return host, port


def bind_error(shown: str, host: str, exc: OSError) -> str:
    """One line saying why an address could not be bound, and which flag changes it."""
    if exc.errno == errno.EADDRINUSE:
        return (f"{shown}: address already in use (another dtpo run or exporter?); pick a free port with "
                "--metrics-addr HOST:PORT, or port 0 for any free one")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{shown}: permission denied (ports below 1024 need root); pick a port above 1023 with --metrics-addr"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"{shown}: {host} is not an address of this machine; use 127.0.0.1 (the default) or one of this "
                "host's addresses with --metrics-addr HOST:PORT")
    return f"{shown}: cannot listen there ({exc.strerror or exc}); change it with --metrics-addr HOST:PORT"


def metrics_dir(run_dir: Path, hostname: str) -> Path:
    """The node's metrics folder: ``RUN_DIR/metrics/<hostname>`` (odd characters of the name replaced)."""
    return Path(run_dir) / METRICS_DIR / (re.sub(r"[^A-Za-z0-9._-]", "_", hostname) or "node")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_metrics_dir(directory: Path, keep_counters: bool = False) -> list[Path]:
    """Make the node's metrics folder and remove what processes no longer alive left there (local rank 0).

    Files of live processes (the other ranks of this node may have started writing) are kept; so are other
    programs' files.

    Args:
        directory: The node's metrics folder.
        keep_counters: Keep dead processes' counters (a restarted attempt of the same run: energy and steps
            add up over attempts); their gauges, stale readings, go either way.

    Returns:
        The files removed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    removed = []
    for path in directory.glob("*.db"):
        match = _FILE.match(path.name)
        if match is None or _alive(int(match["pid"])):
            continue
        if keep_counters and match["kind"] != "gauge":
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    with contextlib.suppress(FileNotFoundError):
        (directory / ENDPOINT_FILE).unlink()
    return removed


def collect_text(directory: Path) -> str:
    """What the node's endpoint would serve now for ``directory``, in the Prometheus text format."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path=str(directory))
    return generate_latest(registry).decode()


class MetricsServer:
    """The HTTP endpoint of one node's metrics folder (prometheus-client's server, on a daemon thread).

    Args:
        directory: The node's metrics folder.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.url: str | None = None
        self._server: Any = None
        self._thread: Any = None

    def start(self, host: str, port: int) -> str:
        """Listen at ``host:port`` (port 0: a free one) and write ``endpoint.json``.

        Returns:
            The URL of the metrics page.

        Raises:
            OSError: The address cannot be bound.
        """
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, path=str(self.directory))
        started = start_http_server(port, addr=host, registry=registry)
        if isinstance(started, tuple):  # prometheus-client >= 0.20: (server, thread), so it can be shut down
            self._server, self._thread = started
            host, port = self._server.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}/metrics"
        endpoint = {"url": self.url, "host": host, "port": port, "pid": os.getpid()}
        tmp = self.directory / f".{ENDPOINT_FILE}.tmp"
        try:
            tmp.write_text(json.dumps(endpoint) + "\n")
            os.replace(tmp, self.directory / ENDPOINT_FILE)
        except OSError as exc:
            log.warning("metrics: cannot write %s (%s)", self.directory / ENDPOINT_FILE, exc.strerror or exc)
        return self.url

    def stop(self) -> None:
        """Stop serving and remove ``endpoint.json`` (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
        if self.url is not None:
            self.url = None
            with contextlib.suppress(OSError):
                (self.directory / ENDPOINT_FILE).unlink()
