"""The worker's broker consumer: Celery's own, with one guard for a Redis restart.

The crash it prevents (kombu 5.7, Celery 5.7, Redis transport): when the connection is lost
while a wake-up is reserved (every pool process busy) and a BRPOP is in flight, Celery's
``on_connection_error_after_connected`` calls ``Connection.collect()``. The task channel's close
fails on the pending BRPOP reply, kombu's ``Transport.close_connection`` then stops at the next
channel whose close fails (the remote-control mailbox or gossip deleting its fanout queue on a
dead Redis), and ``collect()`` detaches the transport (``transport.client = None``) with the task
channel still open. Celery then closes that channel again; restoring its unacknowledged messages
builds a new connection pool from the detached transport and raises ``AttributeError: 'NoneType'
object has no attribute 'hostname'``, which Celery treats as unrecoverable: the main process
exits. ``tests/integration/test_broker_restart.py`` provokes exactly that order.
"""

from __future__ import annotations

import kombu
from celery.worker.consumer import Consumer
from kombu.transport import virtual


class WakeupConsumer(Consumer):
    # Set by Celery's Tasks bootstep (None until it starts and after it stops); celery-types
    # leaves it out of Consumer.
    task_consumer: kombu.Consumer | None

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        # Do not put the reserved wake-ups of the lost connection back into Redis: that restore
        # is the step that crashes, and it buys nothing here. A wake-up is a nudge (the job row
        # is the truth), a restarted Redis has lost them anyway, and the sweeper re-signals every
        # due job nobody claimed. If Redis did keep them (a network blip), its unacked index
        # still holds them and kombu re-queues them after the visibility timeout.
        # (Redis's channel is kombu's virtual one: the kind that restores, and the only one here.)
        if self.task_consumer is not None and isinstance(self.task_consumer.channel, virtual.Channel):
            self.task_consumer.channel.do_restore = False
        super().on_connection_error_after_connected(exc)
