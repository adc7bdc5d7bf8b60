"""The web: the JSON API, the pages for people (ui) and the operators' dashboard (ops), built by
``create_app`` (webapp/app.py).

``create_app`` is loaded when it is first asked for: every ``spacejobs`` command imports this
package (its CLI is ``spacejobs.webapp.cli``), and most of them never build the app, so they do
not pay for importing Flask, the limiter, Redis and every page's module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spacejobs.webapp.app import create_app as create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from spacejobs.webapp.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
