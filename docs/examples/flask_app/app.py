"""A small Flask-SQLAlchemy application of its own, with Space Jobs added: a member starts a
thumbnail of a photo, in the same transaction as the photo, and reads it back.

    flask --app app run      (DATABASE_URL / SQLALCHEMY_DATABASE_URI, REDIS_URL in the environment)

Whom a request acts for is the application's business (a login, a token); here it is the header
X-Person, to keep the example short.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, abort, request

import spacejobs
from models import Person, Photo, Team, db

space = spacejobs.SpaceJobs()


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_prefixed_env(prefix="APP")  # APP_SQLALCHEMY_DATABASE_URI, …
    app.config.update(config or {})
    db.init_app(app)
    # Settings from app.config, under the environment's names (SPACEJOBS_*, REDIS_URL); submits
    # join db.session's transaction, on the application's own engine and database role.
    space.init_app(app, db=db)

    @app.post("/teams/<int:team_id>/photos")
    def add_photo(team_id: int) -> tuple[dict[str, Any], int]:
        team, person = db.get_or_404(Team, team_id), acting_person()
        body = request.get_json()
        photo = Photo(team_id=team.id, organization_id=team.organization_id,
                      title=body["title"], width=body["width"], height=body["height"])
        db.session.add(photo)
        db.session.flush()
        submitted = space.submit(db.session, "thumbs.make", {"photo_id": photo.id},
                                 organization_id=team.organization_id,
                                 requested_by=person.user_id)
        if body.get("fail_after_submit"):  # the view fails after its submit: nothing stays
            db.session.rollback()
            abort(500)
        db.session.commit()  # the photo and its job, or neither; the wake-up goes out now
        return {"photo_id": photo.id, "job_id": str(submitted.job.id)}, 202

    @app.get("/teams/<int:team_id>/jobs/<uuid:job_id>")
    def job(team_id: int, job_id: Any) -> dict[str, Any]:
        team, person = db.get_or_404(Team, team_id), acting_person()
        try:
            member = space.member(db.session, team.organization_id, person.user_id)
            found = space.jobs.get(db.session.connection(), member, job_id)
        except spacejobs.NotFound:
            abort(404)
        answer: dict[str, Any] = {"status": found.status, "error": found.error_code}
        if found.status == "completed":
            _job, result, _stored = space.jobs.result(db.session.connection(), member, job_id)
            answer["result"] = result
        db.session.commit()
        return answer

    return app


def acting_person() -> Person:
    found = db.session.get(Person, int(request.headers.get("X-Person", "0")))
    if found is None:
        abort(401)
    return found
