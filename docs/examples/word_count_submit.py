"""Submit a `word_count` job through the HTTP API, wait for it, print its result.

    SPACEJOBS_URL=http://127.0.0.1:5000 SPACEJOBS_TOKEN=sj_... SPACEJOBS_ORG=... \
        python docs/examples/word_count_submit.py

Only the standard library: any client of the JSON API does the same.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from typing import Any

BASE = os.environ["SPACEJOBS_URL"].rstrip("/")
TOKEN = os.environ["SPACEJOBS_TOKEN"]
ORG = os.environ["SPACEJOBS_ORG"]
FINISHED = {"completed", "failed", "cancelled"}
if not BASE.startswith(("http://", "https://")):
    sys.exit("SPACEJOBS_URL is the web's http:// or https:// address")


def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(  # noqa: S310 (an http(s) URL: checked above)
        BASE + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
        return json.load(answer)


job = call("POST", f"/api/v1/orgs/{ORG}/jobs",
           {"kind": "word_count", "params": {"top": 3, "min_length": 4}})   # 202: queued
deadline = time.monotonic() + 60
while job["status"] not in FINISHED:
    if time.monotonic() > deadline:
        sys.exit(f"job {job['id']} is still {job['status']}")
    time.sleep(0.2)
    job = call("GET", f"/api/v1/orgs/{ORG}/jobs/{job['id']}")
if job["status"] != "completed":
    sys.exit(f"job {job['id']} ended {job['status']}: {job['error']}")
print(json.dumps(call("GET", f"/api/v1/orgs/{ORG}/jobs/{job['id']}/result")))
