"""``spacejobs``: the operators' and scripts' command line.

Creating commands print the new id or token alone on stdout, so scripts can capture it.
``worker`` and ``beat`` replace this process with Celery's own (by module name), so the web
package never imports task bodies and signals reach Celery directly.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import click
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.roles import WORKER_ROLE, admin_url, role_url
from spacejobs.models.db.transaction import owner_transaction
from spacejobs.models.errors import DomainError
from spacejobs.models.kinds import RateLimit
from spacejobs.models.logs import configure_logging
from spacejobs.models.ops import liveness, quota_policy, retention
from spacejobs.models.settings import get_settings, reload_settings
from spacejobs.models.tenancy import accounts, passwords, sessions
from spacejobs.models.tenancy.access import ORG_STATES, ROLE_RANK

T = TypeVar("T")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Space Jobs: durable, tenant-scoped background jobs (Flask + Celery + PostgreSQL)."""
    # Quiet by default: creating commands print only their result on stdout.
    configure_logging("WARNING")


@contextlib.contextmanager
def _admin(actor: str = "cli") -> Iterator[Connection]:
    """An owner-role transaction over DATABASE_URL; domain and connection errors become messages."""
    try:
        engine = make_engine(admin_url(), pool_size=1, application_name="spacejobs-cli")
    except RuntimeError as exc:
        raise click.ClickException(f"{exc}. {_where_the_servers_are()}") from None
    try:
        with owner_transaction(engine, actor=actor) as conn:
            yield conn
    except DomainError as exc:
        raise click.ClickException(exc.message) from None
    except OperationalError:
        raise click.ClickException("The database is unreachable (check DATABASE_URL).") from None
    finally:
        engine.dispose()


def _where_the_servers_are(data_dir: Path = Path(".spacejobs")) -> str:
    """Where a running demo wrote its servers' URLs (``spacejobs demo`` writes
    ``<data-dir>/servers.env``), as the shell line that reads them."""
    from spacejobs.demo.session import SERVERS_FILE

    servers = data_dir / SERVERS_FILE
    read = f"set -a; . {shlex.quote(str(servers))}; set +a"
    if servers.exists():
        return f"A running `spacejobs demo` wrote its servers to {servers}: run `{read}` first."
    return (f"Set it to your database's URL; for a running `spacejobs demo`, run `{read}` "
            "(the file of its --data-dir) first.")


def _run(fn: Callable[[Connection], T]) -> T:
    with _admin() as conn:
        return fn(conn)


# ----------------------------------------------------------------------------- db

@main.group()
def db() -> None:
    """Schema and roles."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create the roles and migrate the schema to the newest revision (idempotent)."""
    from spacejobs.models.db.migrate import upgrade

    try:
        upgrade(admin_url())
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    except OperationalError:
        raise click.ClickException("The database is unreachable (check DATABASE_URL).") from None
    click.echo("database is up to date", err=True)


# ----------------------------------------------------------------------------- retention

@main.group("retention")
def retention_group() -> None:
    """How long history is kept: the database's policy, which the sweeper only applies."""


def _echo_policy(policy: retention.RetentionPolicy) -> None:
    for name, days in (("jobs", policy.jobs_days), ("results", policy.results_days),
                       ("events", policy.events_days), ("audit", policy.audit_days)):
        click.echo(f"{name}\t{days:g} days")


@retention_group.command("show")
def retention_show() -> None:
    """Print the ages past which finished jobs, results, events and audit entries are deleted."""
    _echo_policy(_run(retention.read))


@retention_group.command("set")
@click.option("--jobs-days", type=float, help="Finished jobs, with their events and diagnostics.")
@click.option("--results-days", type=float, help="Results of finished jobs (then 410 result_expired).")
@click.option("--events-days", type=float, help="Events of finished jobs (the job row stays).")
@click.option("--audit-days", type=float, help="The organizations' audit log.")
def retention_set(jobs_days: float | None, results_days: float | None, events_days: float | None,
                  audit_days: float | None) -> None:
    """Change the ages given, keep the others, and print the policy."""
    if None is jobs_days is results_days is events_days is audit_days:
        raise click.UsageError("Give at least one of --jobs-days, --results-days, --events-days, "
                               "--audit-days.")
    _echo_policy(_run(lambda c: retention.change(
        c, jobs_days=jobs_days, results_days=results_days, events_days=events_days,
        audit_days=audit_days)))


# ----------------------------------------------------------------------------- users, orgs, tokens

@main.group()
def users() -> None:
    """Users."""


@users.command("create")
@click.argument("email")
@click.option("--name", default="", help="Display name.")
@click.option("--operator", is_flag=True, help="May use /ops and /metrics.")
def users_create(email: str, name: str, operator: bool) -> None:
    """Create a user; prints its id."""
    user = _run(lambda c: accounts.create_user(c, email, name, operator=operator))
    click.echo(user.id)


@users.command("set-operator")
@click.argument("email")
@click.option("--revoke", is_flag=True, help="Take the operator right away instead.")
def users_set_operator(email: str, revoke: bool) -> None:
    """Grant (or with --revoke, take away) the operator right: /ops and /metrics."""
    _run(lambda c: accounts.set_operator(c, accounts.find_user(c, email).id, not revoke))


@users.command("set-password")
@click.argument("email")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of standard input instead of asking.")
def users_set_password(email: str, password_stdin: bool) -> None:
    """Set EMAIL's password for the web pages (asked twice, never echoed). Every web session of
    that user ends: a new password signs them out everywhere."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("New password", hide_input=True, confirmation_prompt=True)
    try:
        passwords.check_acceptable(password)
    except DomainError as exc:
        raise click.ClickException(exc.message) from None
    ended = _run(lambda c: passwords.set_password(c, accounts.find_user(c, email).id, password))
    click.echo(f"password set; {ended} web session(s) signed out", err=True)


@users.command("sign-out")
@click.argument("email")
def users_sign_out(email: str) -> None:
    """End every web session of EMAIL at once (their API tokens are untouched)."""
    ended = _run(lambda c: sessions.revoke_all(c, accounts.find_user(c, email).id))
    click.echo(f"{ended} web session(s) signed out", err=True)


@main.group()
def orgs() -> None:
    """Organizations and their members."""


@orgs.command("create")
@click.argument("name")
def orgs_create(name: str) -> None:
    """Create an organization; prints its id."""
    click.echo(_run(lambda c: accounts.create_organization(c, name)))


@orgs.command("add-member")
@click.argument("org")
@click.argument("email")
@click.option("--role", type=click.Choice(sorted(ROLE_RANK)), default="member", show_default=True)
def orgs_add_member(org: str, email: str, role: str) -> None:
    """Add EMAIL to ORG (id or name) with a role, or change their role."""

    def add(conn: Connection) -> None:
        accounts.add_member(conn, accounts.resolve_organization(conn, org),
                           accounts.find_user(conn, email).id, role)

    _run(add)


@orgs.command("remove-member")
@click.argument("org")
@click.argument("email")
def orgs_remove_member(org: str, email: str) -> None:
    """Remove EMAIL from ORG. Their queued and running jobs there will fail."""

    def remove(conn: Connection) -> bool:
        return accounts.remove_member(conn, accounts.resolve_organization(conn, org),
                                     accounts.find_user(conn, email).id)

    if not _run(remove):
        raise click.ClickException("That user is not a member of that organization.")


@orgs.command("set-state")
@click.argument("org")
@click.argument("state", type=click.Choice(ORG_STATES))
def orgs_set_state(org: str, state: str) -> None:
    """Set ORG's state: active, read_only, deleting or deleted."""
    _run(lambda c: accounts.set_organization_state(c, accounts.resolve_organization(c, org), state))


@orgs.command("set-weight")
@click.argument("org")
@click.argument("weight", type=int)
def orgs_set_weight(org: str, weight: int) -> None:
    """Set ORG's weight (1-100, default 1): when several organizations have work, their shares of
    the workers' busy time follow their weights."""
    _run(lambda c: accounts.set_claim_weight(c, accounts.resolve_organization(c, org), weight))


@orgs.command("set-rate-limit")
@click.argument("org")
@click.argument("kind")
@click.argument("limit")
def orgs_set_rate_limit(org: str, kind: str, limit: str) -> None:
    """At most LIMIT of KIND's jobs start in ORG in any window: "N per S seconds" (or "N per
    minute", "N per hour"); `default` removes the override, and the kind's own limit, if it
    declares one, applies again. Jobs beyond it stay queued, in order, until the window allows."""
    if limit == "default":
        rate = None
    else:
        try:
            rate = RateLimit.parse(limit)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="LIMIT") from None

    def set_limit(conn: Connection) -> UUID:
        organization_id = accounts.resolve_organization(conn, org)
        accounts.set_rate_limit(conn, organization_id, kind, rate)
        return organization_id

    organization_id = _run(set_limit)
    where = org if org == str(organization_id) else f"{org} ({organization_id})"
    if rate is None:
        click.echo(f"{kind} in {where}: no rate limit of the operators' any more "
                   "(the kind's own applies, if it declares one).")
    else:
        click.echo(f"{kind} in {where}: at most {rate.max_starts} start(s) per "
                   f"{rate.per_seconds} s; jobs beyond it stay queued, in order.")


@orgs.command("set-quota")
@click.argument("org")
@click.argument("limit")
@click.option("--kind", default=None, help="Cap only this kind's active jobs in ORG.")
def orgs_set_quota(org: str, limit: str, kind: str | None) -> None:
    """Cap ORG's active (queued or running) jobs at LIMIT, or with --kind that kind's there;
    LIMIT `default` removes the override. Submits over it are refused (429 too_many_jobs)."""
    if limit == "default":
        max_active = None
    elif limit.isdigit():
        max_active = int(limit)
    else:
        raise click.BadParameter("a whole number, or `default`", param_hint="LIMIT")
    _run(lambda c: accounts.set_quota(c, accounts.resolve_organization(c, org), max_active, kind))


@orgs.command("set-default-quota")
@click.argument("limit", type=click.IntRange(0, quota_policy.MAX_CAP))
def orgs_set_default_quota(limit: int) -> None:
    """Cap every organization's active jobs at LIMIT, unless `orgs set-quota` says otherwise for
    it (a workflow counts with its steps, a fan-out with its children). The database holds it;
    `db upgrade` writes SPACEJOBS_ACTIVE_JOBS_QUOTA into it when that is set."""
    click.echo(f"default quota: {_run(lambda c: quota_policy.change(c, limit))} active jobs")


@main.group()
def tokens() -> None:
    """API tokens."""


@tokens.command("create")
@click.argument("email")
def tokens_create(email: str) -> None:
    """Create an API token for EMAIL; prints it (only its hash is stored)."""
    click.echo(_run(lambda c: accounts.create_token(c, accounts.find_user(c, email).id)))


@tokens.command("revoke")
@click.argument("token_or_id")
def tokens_revoke(token_or_id: str) -> None:
    """Revoke an API token, named by the token itself or by its id (`tokens list`); `-` reads the
    token from standard input, which keeps it out of the shell history. The next request that
    uses it is refused."""
    from_stdin = token_or_id == "-"  # noqa: S105 - the conventional name of standard input
    ref = sys.stdin.readline().strip() if from_stdin else token_or_id
    if not _run(lambda c: accounts.revoke_token(c, ref)):
        raise click.ClickException("No live token matches that.")
    click.echo("token revoked", err=True)


@tokens.command("list")
@click.argument("email")
def tokens_list(email: str) -> None:
    """EMAIL's tokens: id, created, revoked (the tokens themselves are not stored)."""
    for token in _run(lambda c: accounts.list_tokens(c, accounts.find_user(c, email).id)):
        revoked = token["revoked_at"].isoformat() if token["revoked_at"] else "live"
        click.echo(f"{token['id']}  created {token['created_at'].isoformat()}  {revoked}")


# ----------------------------------------------------------------------------- processes

#: gunicorn's access log line: the client, the time, the method and the matched ROUTE's template
#: (set by the app in the WSGI environ, webapp/app.py), never the URL itself, whose values
#: are the client's (a signal's name, a path no route matched, a query string); the status,
#: bytes, milliseconds and the request id that the app's own log lines carry too.
ACCESS_LOG_FORMAT = ('%(h)s %(t)s "%(m)s %({spacejobs.route}e)s" %(s)s %(B)s %(M)sms '
                     '%({x-request-id}o)s')


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True, type=int)
@click.option("--workers", default=2, show_default=True, type=int, help="Gunicorn processes.")
def web(host: str, port: int, workers: int) -> None:
    """Serve the web app with gunicorn (threaded workers)."""
    from gunicorn.app.base import BaseApplication

    settings = get_settings()
    threads = settings.web_threads
    if settings.events_streams_per_process >= threads:
        # Open events streams would be able to take every thread (webapp/streams.py).
        raise click.ClickException(
            f"SPACEJOBS_EVENTS_STREAMS_PER_PROCESS ({settings.events_streams_per_process}) must be "
            f"below SPACEJOBS_WEB_THREADS ({threads}).")

    class Server(BaseApplication):
        def load_config(self) -> None:
            for key, value in {"bind": f"{host}:{port}", "workers": workers, "worker_class": "gthread",
                               "threads": threads, "timeout": 60, "graceful_timeout": 10,
                               "accesslog": "-", "access_log_format": ACCESS_LOG_FORMAT}.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            from spacejobs.webapp import create_app

            configure_logging()
            return create_app()

    Server().run()


def _celery_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "spacejobs.tasks.celery_app", *args]


@main.group(invoke_without_command=True)
@click.option("--concurrency", "-c", default=None, type=int, help="Processes (default: 2).")
@click.option("--pool", default="prefork", show_default=True)
@click.pass_context
def worker(ctx: click.Context, concurrency: int | None, pool: str) -> None:
    """Run a Celery worker that claims and runs jobs (`spacejobs worker check`: is it alive?)."""
    if ctx.invoked_subcommand is not None:
        return
    settings = get_settings()
    argv = _celery_argv("worker", "--loglevel", "INFO", "--pool", pool,
                        "-Q", f"{settings.sweep_queue},{settings.queue}",
                        "-n", f"spacejobs-{uuid.uuid4().hex[:8]}@%h")
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    os.execv(sys.executable, argv)  # noqa: S606 - our own interpreter, fixed arguments


@worker.command("check")
@click.option("--hostname", default=None, help="The worker's host (default: this one).")
@click.option("--stale", default=None, type=float,
              help="Seconds without a heartbeat that fail the check (default: 3 presence intervals).")
@click.option("--due-after", default=liveness.DUE_AFTER, show_default=True, type=float,
              help="Seconds a job may be due beside idle processes before the check fails.")
def worker_check(hostname: str | None, stale: float | None, due_after: float) -> None:
    """Exit 0 if this host's worker is alive and claiming, 1 (saying why) if not: for a
    liveness probe. Run it on the worker's host (it looks at the processes alive here)."""
    settings = get_settings()
    try:
        engine = make_engine(role_url(WORKER_ROLE), pool_size=1,
                             application_name="spacejobs-worker-check")
        with engine.connect() as conn:
            verdict = liveness.check_host(conn, hostname or socket.gethostname(), settings,
                                          stale=stale, due_after=due_after)
    except (DBAPIError, RuntimeError) as exc:
        click.echo(f"FAIL: the database cannot be read ({type(exc).__name__})")
        sys.exit(1)
    click.echo(verdict.summary())
    sys.exit(0 if verdict.ok else 1)


@main.command()
def beat() -> None:
    """Run Celery beat, which schedules the sweeper (safe to run on several hosts)."""
    schedule = Path(tempfile.gettempdir()) / f"spacejobs-beat-{os.getpid()}"
    argv = _celery_argv("beat", "--loglevel", "INFO", "--schedule", str(schedule))
    os.execv(sys.executable, argv)  # noqa: S606 - our own interpreter, fixed arguments


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=5000, show_default=True, type=int)
@click.option("--data-dir", default=".spacejobs", show_default=True, type=click.Path(path_type=Path),
              help="Where the embedded servers keep their data.")
def demo(host: str, port: int, data_dir: Path) -> None:
    """Run everything: embedded servers (unless DATABASE_URL/REDIS_URL are set), migrations,
    demo data, web + worker + beat. Ctrl-C stops all of it."""
    from spacejobs.demo import session as demo_session

    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    # Everything the demo and its processes write lives in data_dir, temporary files included.
    with demo_session.private_tmp(data_dir):
        _run_demo(host, port, data_dir)


def _run_demo(host: str, port: int, data_dir: Path) -> None:
    from spacejobs.demo import session as demo_session
    from spacejobs.demo.seed import seed
    from spacejobs.models.db.migrate import upgrade
    from spacejobs.webapp import embedded

    configure_logging("INFO")
    settings = get_settings()
    servers = None
    # REDIS_URL has a default; the demo embeds Redis unless it was given explicitly.
    redis_given = "redis_url" in settings.model_fields_set
    if not (settings.database_url and redis_given):
        click.echo("starting embedded PostgreSQL and Redis ...", err=True)
        servers = embedded.start(data_dir)
    processes: list[demo_session.DemoProcess] = []
    hurry: list[bool] = []  # a second Ctrl-C while stopping
    servers_file = data_dir / demo_session.SERVERS_FILE
    log_file = data_dir / demo_session.LOG_FILE
    logs = log_file.open("ab")
    try:
        database_url = settings.database_url or servers.database_url("spacejobs")  # type: ignore[union-attr]
        redis_url = settings.redis_url if redis_given else servers.redis_url  # type: ignore[union-attr]
        # The children (and this process, from here on) read the servers from the environment.
        overrides = {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
        if "wakeup_grace" not in settings.model_fields_set:
            overrides["SPACEJOBS_WAKEUP_GRACE"] = "3"
        if settings.secret_key is None:
            overrides["SPACEJOBS_SECRET_KEY"] = secrets.token_hex(32)
        if "demo_kinds" not in settings.model_fields_set:
            overrides["SPACEJOBS_DEMO_KINDS"] = "1"  # the slow export, to watch the live page
        if "results_dir" not in settings.model_fields_set and settings.results_store == "local":
            # Large results beside the embedded servers' data, where the demo keeps its state.
            overrides["SPACEJOBS_RESULTS_DIR"] = str(data_dir / "results")
        os.environ.update(overrides)
        reload_settings()
        upgrade(database_url)
        demo_users = _run(seed)
        spacejobs = [sys.executable, "-m", "spacejobs.webapp.cli"]
        worker_stop = get_settings().shutdown_grace + demo_session.WORKER_STOP_MARGIN
        for name, argv, stop_within in (
                ("web", [*spacejobs, "web", "--host", host, "--port", str(port), "--workers", "1"],
                 15.0),
                ("worker", [*spacejobs, "worker", "--concurrency", "2"], worker_stop),
                ("beat", [*spacejobs, "beat"], 15.0)):
            # Each in its own session so Ctrl-C reaches only us; we stop them in order. Their
            # logs (Celery's banners, the sweeper's lines) go to a file, so that the banner
            # below, with the passwords and tokens, stays on the screen.
            popen = subprocess.Popen(argv, start_new_session=True,  # noqa: S603
                                     stdout=logs, stderr=subprocess.STDOUT)
            processes.append(demo_session.DemoProcess(name, popen, stop_within))
        children = [process.popen for process in processes]
        click.echo(f"the processes' logs go to {log_file}", err=True)
        base = demo_session.local_url(host, port)
        try:
            demo_session.wait_until_answers(base, children)
        except demo_session.WebDidNotStart as error:
            raise click.ClickException(
                f"{error}. The end of {log_file}:\n{demo_session.tail(log_file)}") from None
        # DATABASE_URL: the owner's (a superuser on the embedded server), for `spacejobs` commands.
        demo_session.write_servers_file(data_dir, {"DATABASE_URL": database_url,
                                                   "REDIS_URL": redis_url, "WEB_URL": base})
        _print_banner(host, port, demo_users, servers_file, log_file)
        if not _wait_for_signal_or_exit(children, hurry):
            click.echo(demo_session.tail(log_file), err=True)
    finally:
        demo_session.stop_in_order(processes, lambda line: click.echo(line, err=True),
                                   hurry=lambda: bool(hurry))
        logs.close()
        if servers is not None:
            servers.stop()
        servers_file.unlink(missing_ok=True)  # its servers are gone
        click.echo("stopped.", err=True)


def _print_banner(host: str, port: int, demo_users: list[dict[str, str]],
                  servers_file: Path | None = None, log_file: Path | None = None) -> None:
    click.echo(banner(f"http://{host}:{port}", demo_users, servers_file, log_file))


def banner(base: str, demo_users: list[dict[str, str]], servers_file: Path | None = None,
           log_file: Path | None = None) -> str:
    """What ``spacejobs demo`` prints once the web answers: where to click first, then the
    passwords for the pages and the tokens for the API, and where the servers' URLs are."""
    owner = demo_users[0]
    lines = [
        "",
        f"Space Jobs is running at {base}  (Ctrl-C stops everything)",
        "",
        f"In a browser, open {base}/login and sign in as {owner['email']} with the password below.",
        "On the Jobs page press \"Export projects\": the job page shows it queued, running and",
        "completed, with a Download button. \"Slow export (demo)\" takes 20 s so you can watch it",
        "move and press Cancel. Sign in as olga@ops.example for the operators' dashboard (/ops).",
        "",
        f"  {'email':<22} {'role':<9} {'organization':<15} password",
    ]
    for user in demo_users:
        lines.append(f"  {user['email']:<22} {user['role']:<9} {user['org_name']:<15} {user['password']}")
    lines += ["", "For the JSON API (Authorization: Bearer TOKEN):"]
    for user in demo_users:
        org = f"org {user['org_id']}" if user["org_id"] != "-" else "no organization"
        lines.append(f"  {user['email']:<22} {user['token']}  {org}")
    lines += [
        "",
        "Try:",
        f"  curl -s -H 'Authorization: Bearer {owner['token']}' {base}/api/v1/me",
        f"  curl -si -X POST -H 'Authorization: Bearer {owner['token']}' "
        f"-H 'Content-Type: application/json' -d '{{\"kind\": \"projects_export\"}}' "
        f"{base}/api/v1/orgs/{owner['org_id']}/jobs",
        "",
    ]
    if servers_file is not None:
        lines += [f"The servers' URLs (DATABASE_URL, REDIS_URL, WEB_URL) are in {servers_file}:",
                  f"  set -a; . {shlex.quote(str(servers_file))}; set +a", ""]
    if log_file is not None:
        lines += [f"The web's, the worker's and beat's logs: tail -f {shlex.quote(str(log_file))}", ""]
    return "\n".join(lines)


def _wait_for_signal_or_exit(children: list[subprocess.Popen[bytes]], hurry: list[bool]) -> bool:
    """Return True on Ctrl-C (or SIGTERM), False when a process exits; a second signal, while
    the processes stop, appends to ``hurry``."""
    stop = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop
        if stop:
            hurry.append(True)
        stop = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    while not stop:
        if any(child.poll() is not None for child in children):
            click.echo("a demo process exited; stopping the others. The end of its log:", err=True)
            return False
        time.sleep(0.3)
    return True


if __name__ == "__main__":
    main()
