"""The built-in callbacks that measure and report: energy per window (:mod:`~dtpo.session.callbacks.energy`,
first in the list so later callbacks see each window's joules), progress, partial-record flushes and end-of-run
artifacts, with the assembly of the built-in list (:mod:`~dtpo.session.callbacks.builtin`), and live Prometheus
metrics (:mod:`~dtpo.session.callbacks.metrics`).
"""
