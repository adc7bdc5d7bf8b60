"""Space Jobs: durable, tenant-scoped background jobs for Flask + Celery, with PostgreSQL as the
single source of truth.

This module is the public face: what an application imports. Everything else under
``spacejobs`` is the house's own and may change between releases.
"""
