"""The ``dtpo`` command line."""
