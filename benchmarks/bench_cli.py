"""What the benchmark scripts share on the command line: bad flags end in one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from dtpo.core.errors import first_line


def bad_flag(prog: str, message: str) -> NoReturn:
    """One line on stderr naming ``prog``, exit 2."""
    sys.stderr.write(f"{prog}: error: {first_line(message)}\n")
    raise SystemExit(2)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        bad_flag(self.prog, message)
