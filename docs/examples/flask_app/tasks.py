"""The application's own kind: a thumbnail of a photo. A file called tasks.py, as a Celery
application's often is, beside `import spacejobs`. Its worker loads it by name:
``SPACEJOBS_KIND_MODULES=tasks spacejobs worker``, from this folder."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import text

import spacejobs


class ThumbnailParams(spacejobs.Params):
    photo_id: int
    size: Annotated[int, Field(ge=16, le=1024)] = 128


class PhotoTooLarge(spacejobs.DomainError):
    """A failure the member reads, with a code of its own; permanent: trying again changes
    nothing."""

    code = "photo_too_large"
    message = "The photo is larger than 10,000 pixels on a side."
    permanent = True


@spacejobs.job_kind("thumbs.make", org_states={"active"}, role="member", max_attempts=3,
                    label="Make a thumbnail")
def make_thumbnail(ctx: spacejobs.JobContext, params: ThumbnailParams) -> dict[str, Any]:
    # A transaction scoped to the job's organization: the worker's row-level security admits
    # that organization's photos, while this job's lease holds, and nothing else.
    with ctx.tenant() as tenant:
        photo = tenant.conn.execute(text(
            "SELECT width, height FROM thumbs.photos WHERE id = :id"), {"id": params.photo_id}).one()
    if max(photo.width, photo.height) > 10_000:
        raise PhotoTooLarge()
    scale = params.size / max(photo.width, photo.height)
    ctx.progress("scaling", done=1, total=2)
    name = f"thumb-{params.photo_id}-{params.size}.png"
    with ctx.tenant() as tenant:  # its writes commit only while the lease is still this run's
        tenant.conn.execute(text("UPDATE thumbs.photos SET thumbnail = :name WHERE id = :id"),
                            {"name": name, "id": params.photo_id})
    return {"thumbnail": name, "width": round(photo.width * scale),
            "height": round(photo.height * scale)}
