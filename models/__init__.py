"""Space Jobs domain: schema, roles and row-level security, the job store and the job kinds.

Nothing in this package knows about Flask or Celery.
"""
