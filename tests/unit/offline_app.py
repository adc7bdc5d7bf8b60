"""The real web app, built without any server: its database and broker URLs lead nowhere
(engines and clients connect lazily) and its rate limits count in memory. Only for what runs
before a view touches a server: routing, hooks, error handlers, the OpenAPI document."""

from __future__ import annotations

from typing import Any

from flask import Flask

#: ports nobody listens on: a test that reached a server by mistake fails at once
NOWHERE = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:9/nowhere",
           "OPERATOR_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/nowhere",
           "BROKER_URL": "redis://127.0.0.1:9/0"}


def offline_app(**config: Any) -> Flask:
    from spacejobs.webapp import create_app

    return create_app({"TESTING": True, **NOWHERE, "RATELIMIT_STORAGE_URI": "memory://", **config})
