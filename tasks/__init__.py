"""Celery side of Space Jobs: the app, the runner (claim, lease, heartbeat, finish), beat and its
maintenance chores."""
