"""schemathesis hooks for tests/contract (loaded through SCHEMATHESIS_HOOKS): the error-code
check, and the member's own organization in every path (a random one only ever answers 404)."""

from __future__ import annotations

import os
from typing import Any

import schemathesis

from spacejobs.webapp.errors import HTTP_STATUS


@schemathesis.check
def error_code_is_stable(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 4xx names its error with a code of the error table, whose status is the one answered."""
    if not 400 <= response.status_code < 500:
        return None
    code = response.json()["error"]["code"]
    if HTTP_STATUS.get(code) != response.status_code:
        raise AssertionError(f"{response.status_code} with error.code {code!r}, which the "
                             f"error table gives {HTTP_STATUS.get(code)}")
    return True


@schemathesis.hook
def map_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> dict[str, Any] | None:
    if path_parameters and "org" in path_parameters:
        path_parameters["org"] = os.environ["SPACEJOBS_CONTRACT_ORG"]
    return path_parameters
