"""The operations room: the dashboard's reads (``dashboard``), operator actions (``actions``),
worker presence (``presence``), Prometheus metrics (``metrics``), counters raised from
Python (``counters``) and the retention policy (``retention``)."""
