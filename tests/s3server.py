"""A real S3-compatible HTTP server on localhost (moto's, in server mode) for the S3 results
store's tests: boto3 talks to it over HTTP exactly as it would to a bucket elsewhere."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

#: moto accepts any credentials; these name nobody
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
REGION = "us-east-1"


@contextmanager
def s3_server() -> Iterator[str]:
    """The endpoint URL of a fresh server, stopped at the end."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


def new_bucket(endpoint: str) -> str:
    name = f"spacejobs-results-{uuid.uuid4().hex[:8]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name
