"""The database room: engines and role URLs, tenant-scoped transactions, the named-query loader,
and the migration runner. Nothing here knows about jobs, tenants' data, Flask or Celery."""
