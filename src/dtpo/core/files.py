"""Small file-system facts every layer asks about."""

from __future__ import annotations

import tempfile
from pathlib import Path


def is_writable_dir(path: Path) -> bool:
    """Whether a file can really be created in ``path`` (permission bits lie for root and read-only mounts)."""
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".dtpo-probe-"):
            return True
    except OSError:
        return False
