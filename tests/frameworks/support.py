"""What the framework tests share: a skip with a visible reason where a framework is not installed.

``make test`` runs on a machine without the framework extras (CI): their tests are skipped, saying which extra
``make integration`` installs to run them; ``make integration`` installs them and runs every test marked
``framework``.
"""

from __future__ import annotations

import pytest

from dtpo.core.frameworks import EXTRAS, installed


def needs(framework: str) -> pytest.MarkDecorator:
    """Skip unless ``framework`` (``jax``, ``tensorflow``, ``keras``) is installed, naming the extra."""
    extra = EXTRAS[framework]
    return pytest.mark.skipif(not installed(framework),
                              reason=f"{framework} is not installed (make integration installs dtpo[{extra}])")
