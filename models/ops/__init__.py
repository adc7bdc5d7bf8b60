"""The operations room: the dashboard's reads (``dashboard``), operator actions (``actions``),
worker presence (``presence``), Prometheus metrics (``metrics``) and counters raised from
Python (``counters``)."""
