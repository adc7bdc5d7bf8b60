"""The results store: where results too large for the job row go (a local directory by default,
an S3-compatible bucket optionally), each referenced from its job's ``result_ref``.

- :mod:`models.results.records`: what a stored result is, as the row records it.
- :mod:`models.results.store`: the small store interface and the local directory.
- :mod:`models.results.s3`: the same interface on an S3-compatible bucket (boto3);
  :mod:`models.results.configured` opens the one the settings name.
- :mod:`models.results.attempt`: one attempt's files, and how its return value is kept.
- :mod:`models.results.sweep`: the orphan sweep that keeps store and rows consistent.
"""
