"""The Ray Train controller's side of a dtpo run: why each attempt failed (imports Ray; only ``--engine ray``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ray.train import UserCallback

from dtpo.distributed.ray_failures import describe_worker_failures


class AttemptErrors(UserCallback):
    """Appends one JSON line per failed attempt (``{"error": "rank 1: ..."}``) to ``path``: the errors
    ``dtpo.cli.conclude`` keeps with each earlier attempt in the record.

    Args:
        path: The file (in the run directory; Ray Train's controller runs on the driver's node).
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        """Called by Ray Train's controller once workers of an attempt raised or died."""
        if not worker_exceptions:
            return
        line = json.dumps({"error": describe_worker_failures(dict(worker_exceptions))})
        with contextlib.suppress(OSError), Path(self.path).open("a") as out:
            out.write(line + "\n")
