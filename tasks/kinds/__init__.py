"""The kinds Space Jobs itself ships: ``workflow`` (a submitted canvas; always registered,
``SPACEJOBS_KIND_MODULES``) and the benchmarks' no-op and sleep (``SPACEJOBS_BENCH_KINDS``). The
demo application's kinds are its own (spacejobs.demo.kinds, ``SPACEJOBS_DEMO_KINDS``)."""
