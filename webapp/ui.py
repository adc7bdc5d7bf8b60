"""Pages for people: sign in with email and password, an organization's projects and jobs, and a
live job page with cancel and download.

Views are thin, as in the JSON API, and act through the same job API
(:class:`models.jobs.service.Jobs`, :func:`webapp.jobs.job_api`) to start, show and cancel a job
or read its result; an import is validated by the kind's own params model. Every page re-reads
the session and the CURRENT membership, so a removed member gets the same 404 page as a stranger
on their next click.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from flask import (
    Blueprint,
    Response,
    flash,
    g,
    get_flashed_messages,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.typing import ResponseReturnValue
from flask_limiter import RequestLimit
from sqlalchemy import Connection
from werkzeug.http import generate_etag, quote_etag

from spacejobs.demo.projects import Projects, create_project
from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import DomainError, InvalidParams, InvalidRequest, NotFound
from spacejobs.models.jobs.holds import Waiting, why_waiting
from spacejobs.models.jobs.records import ACTIVE, ALL_STATUSES, Job, Status
from spacejobs.models.jobs.service import JobRights
from spacejobs.models.json_limits import MAX_DEPTH, too_deep
from spacejobs.models.kinds import label_of, load_kinds, registered_kinds, startable_kinds
from spacejobs.models.tenancy import passwords
from spacejobs.models.tenancy.access import Membership, check_allowed
from spacejobs.models.tenancy.accounts import User, get_user, memberships_of, names_of
from spacejobs.webapp.auth import (
    SAFE_METHODS,
    check_csrf,
    csrf_token,
    engine,
    org_transaction,
    page_user,
    parse_id,
    sign_in,
    sign_out,
)
from spacejobs.webapp.errors import HTTP_STATUS
from spacejobs.webapp.forms import Form, form_of, typed_values
from spacejobs.webapp.inputs import MalformedJSON, NestedTooDeep, parse_json
from spacejobs.webapp.jobs import job_api, list_page, start_job
from spacejobs.webapp.limits import (
    address_key,
    limited,
    login_account_global_key,
    login_account_key,
    retry_after,
)
from spacejobs.webapp.results import stored_result_response
from spacejobs.webapp.status import (
    StepList,
    attempt_line,
    attempt_number,
    describe,
    step_list,
    waiting_words,
)

bp = Blueprint("ui", __name__)

#: a parent job's page lists this many of its steps at most, then says how many more
STEPS_SHOWN = 200


def signed_in(view: Callable[..., ResponseReturnValue]) -> Callable[..., ResponseReturnValue]:
    """Pages need a live web session; without one, go and sign in (and come back after)."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> ResponseReturnValue:
        if page_user() is None:
            back = request.full_path.rstrip("?") if request.method in SAFE_METHODS else None
            return redirect(url_for("ui.login", next=back))
        return view(*args, **kwargs)

    return wrapped


def _page(template: str, status: int = 200, **context: Any) -> ResponseReturnValue:
    return render_template(template, csrf=csrf_token(), person=g.get("user"), **context), status


@dataclass(frozen=True)
class OrgPage:
    conn: Connection
    membership: Membership
    memberships: list[dict[str, str]]

    @property
    def org(self) -> str:
        return str(self.membership.organization_id)

    def context(self) -> dict[str, Any]:
        return {"membership": self.membership, "memberships": self.memberships, "org": self.org}


@contextmanager
def org_page(org: str) -> Iterator[OrgPage]:
    """One transaction for an organization's page: the CURRENT membership (404 for anyone else),
    the user's memberships for the switcher, and whatever the page reads."""
    with org_transaction(org, g.user) as (conn, membership):
        page = OrgPage(conn, membership, memberships_of(conn, g.user.id))
        # Visiting an organization chooses it; every request checks the choice again.
        session["org"] = page.org
        yield page


# ----------------------------------------------------------------------------- sign in

def safe_next(target: str | None) -> str | None:
    """Only a path on this site: ``next=https://evil.example`` (or ``//evil.example``,
    ``/\\evil.example``) is ignored, so the sign-in form cannot be a springboard."""
    if not target or len(target) > 2000 or not target.startswith("/") or target.startswith(("//", "/\\")):
        return None
    if any(ch in target for ch in "\\\r\n\t") or any(ord(ch) < 32 for ch in target):
        return None
    parts = urlsplit(target)
    return target if not parts.scheme and not parts.netloc else None


def _throttled(limit: RequestLimit) -> Response:
    """What a throttled sign-in sees: the form again, saying why and for how long."""
    body = render_template("login.html", csrf=csrf_token(), person=None,
                           next=safe_next(request.form.get("next")),
                           email=request.form.get("email", ""),
                           error="Too many sign-in attempts. Wait a minute, then try again.")
    return Response(body, status=429, headers={"Retry-After": str(retry_after(limit))})


def _failed_sign_in(response: Response) -> bool:
    """A password was checked and did not match. A throttled try checked none and is not
    counted: else one address, hammering at its own limit, would push the account's limit
    across all addresses over too, and keep its owner out everywhere."""
    return response.status_code == 401


# Per account from one address first; across addresses, a larger backstop (webapp/limits.py).
@bp.route("/login", methods=["GET", "POST"])
@limited("LOGIN_RATE_LIMIT_ACCOUNT", key_func=login_account_key, methods=["POST"],
         deduct_when=_failed_sign_in, on_breach=_throttled, scope="login-account")
@limited("LOGIN_RATE_LIMIT_ACCOUNT_GLOBAL", key_func=login_account_global_key, methods=["POST"],
         deduct_when=_failed_sign_in, on_breach=_throttled, scope="login-account-global")
@limited("LOGIN_RATE_LIMIT_ADDRESS", key_func=address_key, methods=["POST"],
         deduct_when=_failed_sign_in, on_breach=_throttled, scope="login-address")
def login() -> ResponseReturnValue:
    target = safe_next(request.values.get("next"))
    if request.method == "GET":
        user = page_user()
        if user is not None:
            return redirect(target or _landing(user))
        return _page("login.html", next=target, email="")
    email = request.form.get("email", "")
    try:
        check_csrf()
    except InvalidRequest as error:
        return _page("login.html", 400, next=target, email=email, error=error.message)
    with transaction(engine()) as conn:
        user_id = passwords.check_login(conn, email, request.form.get("password", ""))
        user = get_user(conn, user_id) if user_id else None
    if user is None:
        return _page("login.html", 401, next=target, email=email,
                     error="That email and password do not match an account.")
    sign_in(user.id)
    return redirect(target or (url_for("ops.overview_page") if user.is_operator else _landing(user)))


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    if page_user() is not None:  # checks the CSRF token of a signed-in browser
        sign_out()
    return redirect(url_for("ui.login"))


@bp.get("/")
def home() -> ResponseReturnValue:
    user = page_user()
    if user is None:
        return redirect(url_for("ui.login"))
    landing = _landing(user)
    if landing != url_for("ui.home"):
        return redirect(landing)
    return _page("people/home.html")


def _landing(user: User) -> str:
    """The organization chosen last if the user is still a member of it, else their first;
    the dashboard for an operator without one; else the home page, which says so."""
    with transaction(engine(), user_id=user.id) as conn:
        orgs = [m["organization_id"] for m in memberships_of(conn, user.id)]
    chosen = session.get("org")
    if orgs:
        return url_for("ui.jobs_page", org=chosen if chosen in orgs else orgs[0])
    if user.is_operator:
        return url_for("ops.overview_page")
    return url_for("ui.home")


@bp.post("/switch")
@signed_in
def switch() -> ResponseReturnValue:
    with org_page(request.form.get("org", "")) as page:
        org = page.org
    return redirect(url_for("ui.jobs_page", org=org))


# ----------------------------------------------------------------------------- projects

@bp.get("/orgs/<org>")
@signed_in
def org_home(org: str) -> ResponseReturnValue:
    return redirect(url_for("ui.jobs_page", org=org))


@bp.route("/orgs/<org>/projects", methods=["GET", "POST"])
@signed_in
def projects_page(org: str) -> ResponseReturnValue:
    problem, status = None, 200
    with org_page(org) as page:
        if request.method == "POST":
            name = request.form.get("name", "").strip()
            description = request.form.get("description", "").strip()
            try:
                if not 1 <= len(name) <= 200 or len(description) > 2000:
                    raise InvalidRequest("A project needs a name of 1 to 200 characters "
                                         "(and a description of at most 2,000).")
                project = create_project(page.conn, page.membership, name, description)
            except DomainError as error:
                problem, status = _why_not(error, "Creating a project", page.membership), \
                    HTTP_STATUS.get(error.code, 400)
            else:
                flash(f"Project “{project.name}” created.")
                return redirect(url_for("ui.projects_page", org=page.org))
        projects = Projects(page.conn, page.membership.organization_id).list()
        creation = _refusal(page.membership, {"active"}, "member", "Creating a project")
        return _page("people/projects.html", status, projects=projects, creation=creation,
                     problem=problem, **page.context())


# ----------------------------------------------------------------------------- jobs

@dataclass(frozen=True)
class Offer:
    """A card of the Jobs page: a kind members start from the pages, its form (made from its
    params model), or the sentence that says why it is not there."""

    kind: str
    label: str
    description: str | None
    form: Form
    refusal: str | None


def _offers(membership: Membership) -> list[Offer]:
    load_kinds()
    return [Offer(kind.rules.name, kind.rules.shown_label, kind.rules.description,
                  form_of(kind.rules.params),
                  _refusal(membership, kind.rules.org_states, kind.rules.role,
                           kind.rules.shown_label))
            for kind in startable_kinds()]


def _refusal(membership: Membership, org_states: Any, role: str, what: str) -> str | None:
    try:
        check_allowed(membership, org_states=org_states, role=role)
    except DomainError as error:
        return _why_not(error, what, membership, role)
    return None


def _why_not(error: DomainError, what: str, membership: Membership, role: str | None = None) -> str:
    """A refusal as a sentence that says why, for the person in front of the page."""
    if error.code == "organization_read_only":
        return (f"{what} is unavailable: this organization is read-only, so nothing new can be "
                "written to it. Exports still work; the operators can make it active again.")
    if error.code == "organization_unavailable":
        return f"{what} is unavailable: this organization is being deleted."
    if error.code == "insufficient_role" and role:
        return (f"{what} needs the {role} role; yours here is {membership.role}. "
                "Ask an owner or an admin of the organization.")
    return error.message


@dataclass(frozen=True)
class Typed:
    """A form sent back with a refusal: which one (a kind's, a signal's), what the person typed
    in it, and the fields the refusal names."""

    form: str
    values: Mapping[str, str]
    invalid: frozenset[str]


def _typed(form: str, error: DomainError) -> Typed:
    fields = error.details.get("fields")
    return Typed(form, request.form.to_dict(),
                 frozenset(str(f).split(".")[0] for f in fields) if isinstance(fields, list)
                 else frozenset())


@bp.get("/orgs/<org>/jobs")
@signed_in
def jobs_page(org: str, problem: str | None = None, status: int = 200,
              typed: Typed | None = None) -> ResponseReturnValue:
    status_filter = request.args.get("status") or None
    kind_filter = request.args.get("kind") or None
    cursor = request.args.get("cursor") or None
    with org_page(org) as page:
        jobs, next_cursor = list_page(page.conn, page.membership,
                                      status=status_filter, kind=kind_filter, cursor=cursor)
        names = names_of(page.conn, [job.requested_by for job in jobs])
        held = why_waiting(page.conn, jobs)
        return _page("people/jobs.html", status, jobs=[(job, describe(job, held=held.get(job.id)))
                                                       for job in jobs], held=held,
                     waiting_words=waiting_words, typed=typed,
                     names=names, offers=_offers(page.membership), problem=problem,
                     statuses=ALL_STATUSES, kinds=sorted(load_kinds()), filters=request.args,
                     next_cursor=next_cursor, cursor=cursor, label_of=label_of,
                     attempt_number=attempt_number, **page.context())


@bp.post("/orgs/<org>/jobs")
@signed_in
def start(org: str) -> ResponseReturnValue:
    """Start a kind from its card: its params from the form made of its params model (or the
    JSON file of a model too rich for a form), submitted as the API submits them, by the same
    rules (the kind's organization states and role), refused in the same words."""
    name = request.form.get("kind", "")
    kind = load_kinds().get(name)
    if kind is None or not kind.rules.start_from_pages or kind.rules.child_only:
        raise NotFound()
    form = form_of(kind.rules.params)
    try:
        params = _params_file() if form.rich else typed_values(form, request.form)
        job, _created = start_job(org, g.user, name, params)
    except DomainError as error:
        if error.code == "not_found":
            raise  # not a member (any more): the 404 page, as for a stranger
        with org_page(org) as page:
            problem = _why_not(error, kind.rules.shown_label, page.membership, kind.rules.role)
        return jobs_page(org, problem=problem, status=HTTP_STATUS.get(error.code, 400),
                         typed=_typed(name, error))
    flash_while("Accepted. This page follows the job until it is done.", ACTIVE)
    return redirect(url_for("ui.job_page", org=org, job_id=job.id))


def _params_file() -> Any:
    """The uploaded file's JSON, which the kind's own params model then validates exactly as
    the API validates ``params`` (same rules, same ``invalid_params`` sentence)."""
    upload = request.files.get("file")
    if upload is None or not upload.filename:
        raise InvalidParams("Choose a JSON file to import.")
    try:
        return parse_json(upload.read(), max_depth=MAX_DEPTH)  # the file is the job's params
    except NestedTooDeep:
        raise InvalidRequest(too_deep("An imported file"), fields=["file"]) from None
    except MalformedJSON as error:
        raise InvalidParams(f"The file is not valid JSON ({error}).") from None


@dataclass(frozen=True)
class ParentLink:
    """The job a step or part belongs to, as the step's page names it: the parent's id and
    kind, and what the step is called there (a workflow's step by its name, a fan-out's part
    by its number, as the parent's list of steps calls them)."""

    job_id: UUID
    kind: str
    called: str


@dataclass(frozen=True)
class SignalOffer:
    """A signal a waiting job's kind declares, and the form of its payload's model;
    ``awaited``: the job waits for this one now."""

    name: str
    form: Form
    awaited: bool


def _signal_offers(job: Job, rights: JobRights) -> tuple[SignalOffer, ...]:
    """What the page offers to send: while the job waits, the signals its kind declares, to
    whoever may signal it (the rule the signal itself enforces); nothing to anyone else."""
    kind = registered_kinds().get(job.kind)
    if kind is None or job.status != Status.WAITING or not rights.may_signal:
        return ()
    return tuple(SignalOffer(name, form_of(model), job.wait_signal == name)
                 for name, model in kind.rules.signals.items())


@dataclass(frozen=True)
class JobView:
    job: Job
    shown: Any
    rights: JobRights
    started_by: str
    request_id: str | None
    steps: StepList
    attempts: str
    parent: ParentLink | None
    #: why it waits (models.jobs.holds), if something holds it
    held: Waiting | None = None
    #: the signals its kind declares that the page offers now (a waiting job's, to whoever may
    #: send them)
    signals: tuple[SignalOffer, ...] = ()


def _job_view(page: OrgPage, job_id: str) -> JobView:
    jobs = job_api()
    job = jobs.get(page.conn, page.membership, parse_id(job_id))
    # Whoever may see the job may see its steps: read after (and by) the same rule as the job.
    steps = jobs.steps(page.conn, page.membership, job, limit=STEPS_SHOWN)
    request_id = jobs.request_id_of(page.conn, job)
    held = why_waiting(page.conn, [job]).get(job.id)
    rights = jobs.rights(page.conn, page.membership, job)
    return JobView(job, describe(job, request_id=request_id, held=held), rights,
                   names_of(page.conn, [job.requested_by]).get(job.requested_by, "a former member"),
                   request_id, step_list(job, steps), attempt_line(job), _parent_of(page, job),
                   held, _signal_offers(job, rights))


def _parent_of(page: OrgPage, job: Job) -> ParentLink | None:
    """The parent of a step, read by the same rule as the step (its organization's job)."""
    if job.parent_id is None or job.place is None:
        return None
    jobs = job_api()
    parent = jobs.get(page.conn, page.membership, job.parent_id)
    listed = jobs.steps(page.conn, page.membership, parent, limit=1, after=job.place - 1).rows
    name = listed[0].name if listed and listed[0].place == job.place else None
    return ParentLink(parent.id, parent.kind, f"“{name}”" if name else f"#{job.place + 1}")


#: the category of a job page's notice that holds only while the job is in one of the statuses
#: that follow it (space-separated): the page shows it only then, and its script takes it away
#: when the job moves on, so it never contradicts the state below it
WHILE = "while:"


def flash_while(message: str, statuses: Iterable[Status]) -> None:
    flash(message, WHILE + " ".join(sorted(statuses)))


def job_notices(job: Job) -> list[tuple[str, str]]:
    """The job page's notices, as (message, the statuses it holds in), without those the job
    has already left."""
    shown = []
    flashed: list[tuple[str, str]] = get_flashed_messages(with_categories=True)  # type: ignore[assignment]
    for category, message in flashed:
        holds = category.removeprefix(WHILE) if category.startswith(WHILE) else ""
        if not holds or job.status in holds.split():
            shown.append((message, holds))
    return shown


@bp.get("/orgs/<org>/jobs/<job_id>")
@signed_in
def job_page(org: str, job_id: str, problem: str | None = None, status: int = 200,
             typed: Typed | None = None) -> ResponseReturnValue:
    with org_page(org) as page:
        view = _job_view(page, job_id)
        status_part = _status_part(view, page.org, typed)
        return _page("people/job.html", status, view=view, label_of=label_of,
                     notices=job_notices(view.job), problem=problem, status_part=status_part,
                     status_tag=quote_etag(generate_etag(status_part.encode())), **page.context())


@bp.post("/orgs/<org>/jobs/<job_id>/signals/<name>")
@signed_in
def send_signal(org: str, job_id: str, name: str) -> ResponseReturnValue:
    """Send a signal its kind declares, its payload from the form of the signal's model, through
    the job API as the JSON API sends one: the same rule (who may cancel the job may signal
    it), the same refusals, and the database records who sent it and their role."""
    jobs, jid = job_api(), parse_id(job_id)
    with org_page(org) as page:
        kind = registered_kinds().get(jobs.get(page.conn, page.membership, jid).kind)
    model = kind.rules.signals.get(name) if kind is not None else None
    if model is None:
        raise NotFound()  # a signal its kind does not declare is the API's alone
    form = form_of(model)
    try:
        payload = _signal_payload() if form.rich else typed_values(form, request.form)
        with org_page(org) as page:
            jobs.signal(page.conn, page.membership, jid, name, payload)
    except DomainError as error:
        if error.code == "not_found":
            raise
        with org_page(org) as page:
            problem = _why_not(error, f"Sending “{name}”", page.membership,
                               jobs.rights(page.conn, page.membership,
                                           jobs.get(page.conn, page.membership, jid)).kind_role)
        return job_page(org, job_id, problem=problem, status=HTTP_STATUS.get(error.code, 400),
                        typed=_typed(f"signal:{name}", error))
    flash_while(f"Sent “{name}”: the job goes on by itself.", ACTIVE)
    return redirect(url_for("ui.job_page", org=org, job_id=job_id))


def _signal_payload() -> Any:
    """A payload too rich for a form, typed as JSON; the signal's model validates it."""
    try:
        return parse_json(request.form.get("payload", "").encode(), max_depth=MAX_DEPTH)
    except NestedTooDeep:
        raise InvalidRequest(too_deep("A signal's payload"), fields=["payload"]) from None
    except MalformedJSON as error:
        raise InvalidParams(f"The payload is not valid JSON ({error}).") from None


@bp.get("/orgs/<org>/jobs/<job_id>/status")
@signed_in
def job_status_fragment(org: str, job_id: str) -> ResponseReturnValue:
    """The live part of the job page alone: the page's script fetches it whenever the events
    stream says the job changed, so the states are rendered in one place (Jinja)."""
    with org_page(org) as page:
        view = _job_view(page, job_id)
        response = make_response(_status_part(view, page.org, None))
    # Tagged by its bytes; the page sends the tag it shows, so an unchanged part is a 304 and
    # the page leaves it alone (a screen reader is not read the whole region again).
    response.add_etag()
    return response.make_conditional(request)


def _status_part(view: JobView, org: str, typed: Typed | None) -> str:
    """The live part of the job page, as the page includes it and its script fetches it."""
    return render_template("people/_job_status.html", csrf=csrf_token(), view=view, org=org,
                           label_of=label_of, typed=typed)


@bp.post("/orgs/<org>/jobs/<job_id>/cancel")
@signed_in
def cancel(org: str, job_id: str) -> ResponseReturnValue:
    jobs, jid = job_api(), parse_id(job_id)
    with org_page(org) as page:
        # What it was doing decides the sentence; the cancel itself re-reads the row, locked.
        was = jobs.get(page.conn, page.membership, jid).status
        job = jobs.cancel(page.conn, page.membership, jid, g.request_id)
    if job.status == "cancel_requested":
        flash_while("Cancel requested: the job stops at its next safe point. Until then it is "
                    "still running.", {Status.CANCEL_REQUESTED})
    elif was == Status.WAITING:
        flash_while("Cancelled while it waited: it will not run again.", {Status.CANCELLED})
    else:
        flash_while("Cancelled before it started.", {Status.CANCELLED})
    return redirect(url_for("ui.job_page", org=org, job_id=job_id))


@bp.post("/orgs/<org>/jobs/<job_id>/resume")
@signed_in
def resume(org: str, job_id: str) -> ResponseReturnValue:
    """A failed or cancelled workflow resumed: the page of the new workflow that runs what did
    not complete."""
    with org_page(org) as page:
        new = job_api().resume(page.conn, page.membership, parse_id(job_id), g.request_id)
    flash("Resumed: this new workflow runs the steps that did not complete; those that did are "
          "not run again.")
    return redirect(url_for("ui.job_page", org=org, job_id=new.id))


@bp.get("/orgs/<org>/jobs/<job_id>/download")
@signed_in
def download(org: str, job_id: str) -> ResponseReturnValue:
    """The result as a file, to CURRENT members holding the kind's role (the API's rule)."""
    with org_page(org) as page:
        job, result, stored = job_api().result(page.conn, page.membership, parse_id(job_id),
                                               g.request_id)
    if stored is not None:
        return stored_result_response(job, stored, envelope=False)
    filename = f"{job.kind.replace('.', '-')}-{job.created_at:%Y%m%d-%H%M%S}-{str(job.id)[:8]}.json"
    return Response(json.dumps(result, indent=2), mimetype="application/json", headers={
        "Content-Disposition": f'attachment; filename="{filename}"',
        "Cache-Control": "no-store",
    })
