"""Space Jobs and the peers it is measured against, each a self-contained driver with one
interface.

    peer = load_peer("pgqueuer").prepare(admin_url, redis_url, run_id)
    try:
        peer.enqueue_rate(n), peer.bulk_enqueue_rate(n), peer.drain_rate(n, processes=2),
        peer.latency(rate=50, seconds=20)          # each returns a Figure
    finally:
        peer.cleanup()

Each peer runs on its authors' defaults in its own database (or Redis keys) on the given
servers, with its workers as separate processes, and every figure is read from the peer's own
records. The peers' packages are the optional ``bench`` extra (``pip install -e '.[bench]'``);
nothing outside ``bench/`` imports them. ``python -m bench.peers --quick`` is a smoke run.
"""

from __future__ import annotations

import importlib

from bench.peers.base import Figure, Peer, PeerError

# name -> "module:class"; imported on demand, so one missing optional package only costs its peer.
PEERS = {
    "spacejobs": "bench.peers.spacejobs:SpaceJobsPeer",
    "celery": "bench.peers.plain_celery:PlainCelery",
    "pgqueuer": "bench.peers.pgqueuer:PgQueuerPeer",
    "procrastinate": "bench.peers.procrastinate:ProcrastinatePeer",
}


def load_peer(name: str) -> Peer:
    """A fresh, unprepared driver for the peer called ``name`` (a key of :data:`PEERS`)."""
    module, cls = PEERS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["PEERS", "Figure", "Peer", "PeerError", "load_peer"]
