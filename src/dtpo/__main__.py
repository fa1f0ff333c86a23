"""``python -m dtpo`` is the ``dtpo`` command."""

from dtpo.cli.app import main

main()
