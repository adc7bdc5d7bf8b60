"""The results store on an S3-compatible bucket, through boto3 (``pip install 'spacejobs[s3]'``).

Credentials come from boto3's own chain (environment, shared files, instance or task roles), so
none passes through our settings. The bucket must exist and stay private: objects are read only
by our web, after the membership check, never through a public or presigned URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from spacejobs.models.errors import ResultMissing
from spacejobs.models.results.store import CountingReader, Source, StoredFile, StoredObject
from spacejobs.models.settings import Settings


class S3ResultStore:
    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    @classmethod
    def from_settings(cls, settings: Settings) -> S3ResultStore:
        if not settings.s3_bucket:
            raise ValueError("SPACEJOBS_RESULTS_STORE=s3 needs SPACEJOBS_S3_BUCKET")
        client = boto3.client(
            "s3", endpoint_url=settings.s3_endpoint_url or None,
            region_name=settings.s3_region or None,
            config=Config(retries={"mode": "standard"}, connect_timeout=5, read_timeout=60))
        return cls(client, settings.s3_bucket, settings.s3_prefix)

    def put(self, key: str, source: Source, *, content_type: str) -> int:
        # upload_fileobj switches to a multipart upload for large objects: an interrupted one
        # never appears under the key (give the bucket a lifecycle rule that aborts them).
        reader = CountingReader(source)
        self.client.upload_fileobj(reader, self.bucket, self.prefix + key,
                                   ExtraArgs={"ContentType": content_type})
        return reader.count

    def open(self, key: str) -> StoredFile:
        try:
            found = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ResultMissing() from None
            raise
        return StoredFile(found["Body"], int(found["ContentLength"]), found.get("ContentType"))

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.prefix + key)

    def list(self) -> Iterator[StoredObject]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix, PaginationConfig={"PageSize": 1000})
        for page in pages:
            for item in page.get("Contents", []):
                yield StoredObject(item["Key"][len(self.prefix):], int(item["Size"]),
                                   item["LastModified"])

