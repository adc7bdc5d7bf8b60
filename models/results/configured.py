"""The results store the settings name: the local directory, or an S3-compatible bucket."""

from __future__ import annotations

from spacejobs.models.results.store import LocalResultStore, ResultStore
from spacejobs.models.settings import Settings


def open_store(settings: Settings) -> ResultStore:
    if settings.results_store == "s3":
        from spacejobs.models.results.s3 import S3ResultStore  # boto3 is optional: the `s3` extra

        return S3ResultStore.from_settings(settings)
    return LocalResultStore(settings.results_dir)
