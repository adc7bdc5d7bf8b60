"""The application's own Celery settings, for Celery tasks of its own. Space Jobs reads its own
(spacejobs.celeryconfig): the two never meet."""

broker_url = "redis://127.0.0.1:6379/1"
task_serializer = "json"
