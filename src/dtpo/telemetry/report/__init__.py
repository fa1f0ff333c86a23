"""The HTML report of one or several runs: the figures it shows (:mod:`~dtpo.telemetry.report.data`),
SVG plots on a small SVG writer (:mod:`~dtpo.telemetry.report.plots`, :mod:`~dtpo.telemetry.report.curves`,
:mod:`~dtpo.telemetry.report.svg`), markup and sections (:mod:`~dtpo.telemetry.report.markup`,
:mod:`~dtpo.telemetry.report.sections`) and the page (:mod:`~dtpo.telemetry.report.html`).
"""
