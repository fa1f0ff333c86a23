"""The run store: one SQLite database in which every train, bench, simulate and plan is registered
(:class:`~dtpo.telemetry.store.database.RunStore`), a stored run (:mod:`~dtpo.telemetry.store.rows`), the key
figures kept per kind (:mod:`~dtpo.telemetry.store.figures`), where the database lives
(:mod:`~dtpo.telemetry.store.paths`), filters and comparisons (:mod:`~dtpo.telemetry.store.query`) and rebuilding
it from run directories (:mod:`~dtpo.telemetry.store.reindex`).
"""
