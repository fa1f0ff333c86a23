"""What people and dashboards read: the summary and scaling tables, progress, the run store
(:mod:`dtpo.telemetry.store`), the HTML report (:mod:`dtpo.telemetry.report`), Chrome traces, Prometheus metrics
with their per-node server, and the Grafana dashboard built on them.
"""
