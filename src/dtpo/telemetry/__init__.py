"""What people and dashboards read: the summary table, progress display (and later Prometheus, reports)."""
