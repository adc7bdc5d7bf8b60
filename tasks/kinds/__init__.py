"""The kinds this application ships: the projects' export, import, report and archive
(always registered, ``SPACEJOBS_KIND_MODULES``), the demo's slow export (``SPACEJOBS_DEMO_KINDS``)
and the benchmarks' no-op and sleep (``SPACEJOBS_BENCH_KINDS``)."""
