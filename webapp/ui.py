"""HTML for people: a session login by API token (the dashboard uses it)."""

from __future__ import annotations

import secrets

from flask import Blueprint, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue

from models.db.transaction import transaction
from models.tenancy.accounts import authenticate
from webapp.auth import engine

bp = Blueprint("ui", __name__)


@bp.route("/login", methods=["GET", "POST"])
def login() -> ResponseReturnValue:
    error = None
    if request.method == "POST":
        with transaction(engine()) as conn:
            user = authenticate(conn, request.form.get("token", "").strip())
        if user is not None:
            session.clear()
            session["user_id"] = str(user.id)
            session["csrf"] = secrets.token_urlsafe(24)
            return redirect(url_for("ops.overview_page") if user.is_operator else url_for("ui.login"))
        error = "That token is not valid."
    return render_template("login.html", error=error), 401 if error else 200


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    session.clear()
    return redirect(url_for("ui.login"))
