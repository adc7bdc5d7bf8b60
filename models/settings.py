"""Every setting of Space Jobs, read once from the environment, validated and typed.

Web, workers, beat, the CLI and ``celeryconfig.py`` all read this one object; no other module
reads ``os.environ``. The configuration table of ``docs/reference/configuration.md`` is checked
against these fields by a test (``tests/unit/test_settings.py``), so a new setting cannot go
undocumented.

pydantic-settings rather than a hand-written dataclass: we already validate request bodies
with pydantic, and it gives typed parsing (``"1"`` → ``True``, ``"2.5"`` → ``2.5``) with a
clear error naming the variable when a value does not parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import IPv4Address
from typing import Any, Literal

from pydantic import Field, IPvAnyAddress, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Environment variables are ``SPACEJOBS_<FIELD>``, except ``DATABASE_URL`` and ``REDIS_URL``."""

    model_config = SettingsConfigDict(env_prefix="SPACEJOBS_", frozen=True, extra="ignore")

    # -- servers and roles -----------------------------------------------------------------
    database_url: str | None = Field(
        None, validation_alias="DATABASE_URL",
        description="a role that may migrate and create roles; web and workers derive their own "
                    "role URLs from it (demo and tests: embedded when unset)")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", validation_alias="REDIS_URL",
        description="Celery broker and rate-limit counters (demo and tests: embedded when unset)")
    app_database_url: str | None = Field(
        None, description="explicit URL for the web role `space_app` (default: derived)")
    worker_database_url: str | None = Field(
        None, description="explicit URL for the worker role `space_worker` (default: derived)")
    operator_database_url: str | None = Field(
        None, description="explicit URL for the dashboard role `space_operator` (default: derived)")
    db_role_password: SecretStr | None = Field(
        None, description="set on the login roles by `db upgrade`, used in derived URLs "
                          "(each role's own password below takes precedence)")
    app_db_password: SecretStr | None = Field(
        None, description="`space_app`'s own password: set by `db upgrade`, used in its derived URL")
    worker_db_password: SecretStr | None = Field(
        None, description="`space_worker`'s own password: set by `db upgrade`, used in its derived URL")
    operator_db_password: SecretStr | None = Field(
        None, description="`space_operator`'s own password: set by `db upgrade`, used in its "
                          "derived URL")
    db_pooler: Literal["none", "transaction"] = Field(
        "none", description="`transaction` when the role URLs lead through a transaction-mode "
                            "pooler such as PgBouncer: no prepared statements, the web's "
                            "statement timeout set in each transaction instead of at connect, "
                            "and LISTEN only through `SPACEJOBS_LISTEN_DATABASE_URL` "
                            "(docs/scaling.md)")
    listen_database_url: str | None = Field(
        None, description="a direct server (no pooler) for LISTEN (worker linger, `Jobs.wait`): "
                          "its host, port and database, with each process's own role and "
                          "password (default: the process's own URL; with "
                          "`SPACEJOBS_DB_POOLER=transaction` and this unset, no LISTEN: linger "
                          "is off and `wait` re-reads the job every 5 s)")
    db_tcp_timeout: float = Field(
        15, ge=0, description="seconds a PostgreSQL connection may go unanswered at the TCP level "
                              "(data not acknowledged, or keepalive probes of an idle one) before "
                              "it is dropped and opened again: a network cut becomes an error, "
                              "not a statement hanging until the kernel gives up (~15 min) or "
                              "retransmits after the heal (up to 2 min); 0: the kernel's "
                              "defaults (TCP only: unix sockets ignore it)")

    # -- queue and worker ------------------------------------------------------------------
    queue: str = Field("spacejobs", description="the Celery queue of wake-ups (sweeps use "
                                                "`<queue>.sweep`; `spacejobs worker` reads both)")
    drain_limit: int = Field(
        1000, ge=1, description="jobs one wake-up may run back to back (then it wakes another)")
    claim_batch: int = Field(
        100, ge=1, le=1000, description="the most jobs one claim leases at once (it adapts below "
                                        "that to how long jobs take)")
    linger_seconds: float = Field(
        1.0, ge=0, description="after the queue runs dry, a pool process waits this long for a "
                               "new job (LISTEN/NOTIFY) before it goes back to Celery; 0 turns it off")
    worker_concurrency: int = Field(2, ge=1, description="Celery processes per worker")
    floor_interval: float = Field(
        1.0, gt=0, le=60, description="seconds between a pool process's looks at the broker: "
                                      "while it is unreachable, the process claims due jobs from "
                                      "PostgreSQL alone (LISTEN, and a claim at least this often)")
    floor_idle_poll: float = Field(
        10, ge=0, description="with the broker reachable, a pool process that has not drained "
                              "for this long claims once by itself (a wake-up lost or never "
                              "heard costs latency, not progress); 0 turns it off")
    shutdown_grace: float = Field(
        20, ge=0, description="seconds running jobs may go on after SIGTERM before they are given back")
    presence_interval: float = Field(5, gt=0, description="seconds between worker presence heartbeats")
    cancel_check_interval: float = Field(
        0.5, gt=0, description="seconds between a worker process's looks at whether the job it "
        "runs was asked to cancel (a read of its status, from the job's first such interval on; "
        "the lease heartbeat, every third of the lease, tells it too)")
    controls_ttl: float = Field(
        1.0, ge=0, le=60, description="seconds a worker process keeps the operators' controls of "
                                      "kinds (pause, concurrency limit) before reading them again: "
                                      "a change reaches every worker within this time")
    worker_health_port: int = Field(
        0, ge=0, le=65535, description="a worker's HTTP liveness probe (`GET /healthz` on this "
                                       "port, at `SPACEJOBS_WORKER_HEALTH_BIND`: 200 or 503 with "
                                       "the reason, as `spacejobs worker check` says); 0 turns "
                                       "it off")
    worker_health_bind: IPvAnyAddress = Field(
        IPv4Address("127.0.0.1"),
        description="the address the liveness probe listens on: loopback by default, as the "
                    "probe has no authentication, so only the worker's own host (or container) "
                    "reaches it; a probe from outside the container (a Kubernetes `httpGet`, "
                    "another host) needs `0.0.0.0` (every IPv4 interface; `::`, IPv6's)")
    worker_offline_after: float = Field(
        30, gt=0, description="seconds of silence after which the dashboard shows a worker offline")

    # The default cap is the database's policy (models/ops/quota_policy.py): read only by
    # `spacejobs db upgrade`, which writes it into the database when it is set.
    active_jobs_quota: int | None = Field(
        None, ge=0, le=2**31 - 1,
        description="most active (queued, running or waiting) jobs one organization may have, a "
                    "workflow's steps and a fan-out's children included (1000 unless set); "
                    "`spacejobs db upgrade` writes it into the database's policy, which "
                    "`spacejobs orgs set-default-quota` changes too; operators override it per "
                    "organization and kind (`spacejobs orgs set-quota`)")

    # -- beat's maintenance chores (tasks/maintenance/) and retention ----------------------------
    # SPACEJOBS_SWEEP_INTERVAL stays the one cadence of the chores that were one sweep, and each
    # of them may have its own: the package's docstring says why.
    sweep_interval: float = Field(
        5, gt=0, description="seconds between runs of each of beat's maintenance chores that has "
                             "no interval of its own set: expired leases, re-signals, waits, "
                             "retention, metrics (docs/guides/operations.md, \"Maintenance\")")
    maintenance_expired_leases_interval: float | None = Field(
        None, gt=0, description="seconds between runs of the chore that puts jobs whose lease ran "
                                "out back in the queue, or ends them (default: "
                                "`SPACEJOBS_SWEEP_INTERVAL`)")
    maintenance_resignal_interval: float | None = Field(
        None, gt=0, description="seconds between runs of the chore that re-sends the wake-up of "
                                "due jobs nobody claimed (default: `SPACEJOBS_SWEEP_INTERVAL`)")
    maintenance_waits_interval: float | None = Field(
        None, gt=0, description="seconds between runs of the chore that puts waiting jobs whose "
                                "moment or children's end came back in the queue, the floor under "
                                "the timers and the jobs trigger (default: `SPACEJOBS_SWEEP_INTERVAL`)")
    maintenance_retention_interval: float | None = Field(
        None, gt=0, description="seconds between runs of the chore that purges history past the "
                                "database's retention policy and deletes the stored files it let "
                                "go (default: `SPACEJOBS_SWEEP_INTERVAL`)")
    maintenance_metrics_interval: float | None = Field(
        None, gt=0, description="seconds between runs of the chore that folds metric events into "
                                "the counters (default: `SPACEJOBS_SWEEP_INTERVAL`)")
    maintenance_claim_heads_interval: float = Field(
        1, gt=0, description="seconds between runs of the chore that moves the claim's heads "
                             "forward, past the jobs that left the queue, so that a claim reads "
                             "no history (docs/guides/operations.md, \"Long transactions\")")
    claim_head_lag: float = Field(
        5, ge=0, description="seconds of the most recent queue history a claim may still read: "
                             "the claim_heads chore moves a head no further than this long ago")
    maintenance_periodic_interval: float | None = Field(
        None, gt=0, description="seconds between beat's looks for a new period of the periodic "
                                "jobs (default: `SPACEJOBS_TIMER_INTERVAL`)")
    timer_interval: float = Field(
        0.25, gt=0, le=60,
        description="seconds between runs of beat's chore of due timers (`ctx.sleep`, "
                    "`sleep_until`, a signal's timeout): a timer goes back to the queue within "
                    "about this long after its moment (one indexed statement a run, in every beat)")
    wakeup_grace: float = Field(
        5, ge=0, description="seconds a due job waits for its wake-up before beat's resignal "
                             "chore re-sends it")
    # Retention is the database's policy (models/ops/retention.py): these are read only by
    # `spacejobs db upgrade`, which writes those that are set into it.
    keep_jobs_days: float | None = Field(
        None, gt=0, description="retention of finished jobs, in days (30 unless set); "
                                "`spacejobs db upgrade` writes it into the database's policy")
    keep_results_days: float | None = Field(
        None, gt=0, description="retention of results, in days (7 unless set); as above")
    keep_events_days: float | None = Field(
        None, gt=0, description="retention of job events, in days (30 unless set); as above")
    keep_audit_days: float | None = Field(
        None, gt=0, description="retention of the organizations' audit log, in days "
                                "(365 unless set); as above")

    # -- results store ---------------------------------------------------------------------
    results_store: Literal["local", "s3"] = Field(
        "local", description="where results too large for the job row go: `local` (a directory) "
                             "or `s3` (an S3-compatible bucket; needs the `s3` extra)")
    results_dir: str = Field(
        "~/.local/share/spacejobs/results",
        description="the local results store: a directory web, workers and beat all reach "
                    "(a shared filesystem for several hosts)")
    result_inline_max_bytes: int = Field(
        256 * 1024, ge=0, description="a JSON result larger than this (encoded) goes to the store")
    results_orphan_grace: float = Field(
        3600, ge=0, description="seconds a stored file no job row references is kept before the "
                                "orphan sweep deletes it")
    results_sweep_interval: float = Field(
        600, gt=0, description="seconds between runs of beat's orphan sweep of the results store "
                               "(it lists the whole store)")
    s3_bucket: str | None = Field(None, description="the bucket of the `s3` results store")
    s3_prefix: str = Field("", description="a key prefix inside that bucket")
    s3_endpoint_url: str | None = Field(
        None, description="an S3-compatible endpoint (MinIO, Ceph...); unset: AWS")
    s3_region: str | None = Field(None, description="the bucket's region")

    # -- web -------------------------------------------------------------------------------
    web_statement_timeout_ms: int = Field(
        5000, ge=1, description="bound on every web statement (then 503)")
    events_poll_seconds: float = Field(0.5, gt=0, description="the events stream's poll interval")
    events_max_seconds: float = Field(
        120, gt=0, description="the events stream's lifetime (an `EventSource` reconnects by itself)")
    poll_rate_limit: str = Field(
        "600 per minute", description="per API token, on `GET …/jobs/{id}`")
    api_rate_limit: str = Field(
        "1200 per minute", description="per API token (or web session), shared by every other "
                                       "JSON API request and the operators' JSON API")
    submit_rate_limit: str = Field(
        "600 per minute", description="per API token, on `POST …/jobs` and `POST …/jobs:batch`")
    org_submit_rate_limit: str = Field(
        "3000 per minute", description="per organization, on the same submits (counted once "
                                       "the member is authenticated: strangers cannot spend it)")
    rate_limit_fail: Literal["open", "closed"] = Field(
        "open", description="when Redis (the counters) is unreachable: `open` serves requests "
                            "with each web process counting in memory, `closed` answers 503")
    rate_limit_timeout: float = Field(
        0.25, gt=0, description="seconds to connect to, or wait for, Redis for one rate-limit "
                                "count before the `rate_limit_fail` rule applies")
    events_streams_per_process: int = Field(
        8, ge=0, description="open events streams one web process serves at once; keep it "
                             "well below `web_threads` so other requests always find a thread")
    events_streams_per_organization: int = Field(
        4, ge=0, description="open events streams one organization may hold in one web process")
    events_streams_per_credential: int = Field(
        2, ge=0, description="open events streams one API token or web session may hold in one "
                             "web process")
    web_threads: int = Field(
        16, ge=2, description="threads per `spacejobs web` process (gunicorn gthread); each keeps "
                              "one database connection, and each open events stream holds a "
                              "thread. With few cores, fewer threads answer more "
                              "requests a second (one GIL per process: docs/benchmarks.md, 'Where "
                              "a web submit's time goes')")
    secret_key: SecretStr | None = Field(
        None, description="signs the session cookie; set it when several web processes serve "
                          "sessions (default: random per process)")
    session_idle_minutes: float = Field(
        30, gt=0, description="a web session ends after this long without a request")
    session_max_hours: float = Field(
        12, gt=0, description="a web session ends this long after sign-in, however busy")
    session_cookie_secure: bool = Field(
        False, description="`1` marks the session cookie `Secure` (set it when served over HTTPS)")
    # New passwords' argon2id costs. A sign-in hashes with the costs its stored hash names, so
    # a change applies to passwords set from then on. The floors are OWASP's least profile
    # (19 MiB, 2 passes, 1 lane); the defaults are RFC 9106's second recommendation, as
    # argon2-cffi has them.
    password_memory_kib: int = Field(
        65536, ge=19456, le=4194304,
        description="KiB of memory one password hash takes (argon2id's m); every sign-in "
                    "takes this much while it hashes")
    password_time_cost: int = Field(
        3, ge=2, le=20, description="passes over that memory (argon2id's t)")
    password_parallelism: int = Field(
        4, ge=1, le=16, description="lanes hashed in parallel (argon2id's p)")
    login_rate_limit_account: str = Field(
        "5 per minute", description="failed sign-ins allowed per email address from one client "
                                    "address")
    login_rate_limit_account_global: str = Field(
        "20 per minute", description="failed sign-ins allowed per email address from all client "
                                     "addresses together, the backstop against guessing from many "
                                     "addresses (keep it above the per-address limit: then one "
                                     "address alone cannot lock the person out)")
    login_rate_limit_address: str = Field(
        "20 per minute", description="failed sign-ins allowed per client address")
    failed_auth_rate_limit_address: str = Field(
        "30 per minute", description="failed authentications (an unknown or revoked API token, "
                                     "a dead session cookie) allowed per client address; past "
                                     "it, that address's requests that carry a credential are "
                                     "answered 429 without a database lookup")
    failed_auth_rate_limit_global: str = Field(
        "600 per minute", description="failed authentications allowed from all client addresses "
                                      "together, the backstop against a flood spread over many "
                                      "addresses: past it, every request that carries a "
                                      "credential is answered 429 until its window ends (keep it "
                                      "well above the per-address budget)")

    # -- broker ----------------------------------------------------------------------------
    broker_timeout: float = Field(
        2, gt=0, description="seconds to give up on the broker (the row is already safe)")
    wakeup_coalesce_ms: int = Field(
        1000, ge=1, description="a pending wake-up stands for every submit for at most this long "
                                "(see \"Wake-ups\")")
    broker_backoff: float = Field(
        5, ge=0, description="after a failed publish, the web skips publishing this long "
                             "(beat's resignal chore re-sends)")
    task_events: bool = Field(True, description="Celery task events for Flower")
    task_sent_events: bool = Field(
        False, description="the \"task-sent\" event; it costs every wake-up a second publish")
    remote_control: bool = Field(
        False, description="Celery remote control (`celery control`, `celery inspect`, Flower's "
                           "worker actions) through the broker; off, a broker client cannot stop "
                           "or reconfigure workers")

    periodic_jobs: str = Field(
        "[]", description="periodic jobs, a JSON list of {name, kind, organization_id, "
                          "requested_by, params?, schedule?} (docs/concepts/job-row.md, \"Periodic jobs\")")

    # -- kinds and logs --------------------------------------------------------------------
    bench_kinds: bool = Field(False, description="`1` registers `bench.noop` and `bench.sleep`")
    demo_kinds: bool = Field(
        False, description="`1` registers the kinds of Space, the demo application "
                           "(`spacejobs.demo.kinds`: the projects' export, import, archive and "
                           "report, and `demo.slow_export`, an export slow enough to watch); "
                           "`spacejobs demo` and `compose.yaml` set it")
    kind_modules: str = Field(
        "spacejobs.tasks.kinds.workflow",
        description="comma-separated modules whose `@job_kind`s every process registers at "
                    "start (an application names its own here, or in "
                    "`SPACEJOBS_EXTRA_KIND_MODULES`)")
    extra_kind_modules: str = Field("", description="comma-separated modules with more kinds, "
                                                    "after `SPACEJOBS_KIND_MODULES`")
    log_format: Literal["text", "json"] = Field(
        "text", description="`json` for one JSON object per line")
    log_level: str = Field("INFO", description="the log level of web, worker and beat")

    # -- traces (OpenTelemetry's own variables; the SDK reads the rest of OTEL_*) ---------------
    otel_sdk_disabled: bool = Field(
        False, validation_alias="OTEL_SDK_DISABLED",
        description="`true`: no traces whatever else is set (the OpenTelemetry specification's switch)")
    otel_traces_exporter: str | None = Field(
        None, validation_alias="OTEL_TRACES_EXPORTER",
        description="`otlp` or `console` turns traces on (needs the `otel` extra); `none` keeps "
                    "them off. Unset: on only when an OTLP endpoint below is set "
                    "([Traces](../guides/operations.md#traces))")
    otel_exporter_otlp_endpoint: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
        description="where spans go over OTLP/HTTP (`/v1/traces` is added); setting it turns "
                    "traces on")
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        description="the traces' own OTLP/HTTP URL, taken as it is; setting it turns traces on")
    otel_exporter_otlp_protocol: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_PROTOCOL",
        description="`http/protobuf` (the default, and the one protocol we ship); another leaves "
                    "traces off, with a warning")
    otel_exporter_otlp_traces_protocol: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        description="the same for traces alone (wins over the one above)")

    @property
    def extra_kind_module_names(self) -> list[str]:
        return [name.strip() for name in self.extra_kind_modules.split(",") if name.strip()]

    @property
    def kind_module_names(self) -> list[str]:
        """Every module whose kinds this process registers, in order: the configured ones, the
        benchmark's and the demo's when enabled, then the extra ones."""
        names = [name.strip() for name in self.kind_modules.split(",") if name.strip()]
        names += (["spacejobs.tasks.kinds.bench"] * self.bench_kinds
                  + ["spacejobs.demo.kinds"] * self.demo_kinds)
        return names + self.extra_kind_module_names

    def maintenance_interval(self, chore: str) -> float:
        """Seconds between runs of one of beat's maintenance chores (its ``name``): its own
        setting when set, else the cadence it shares (the sweep's, or the timers' for periodic)."""
        own = {
            "expired_leases": self.maintenance_expired_leases_interval,
            "resignal": self.maintenance_resignal_interval,
            "waits": self.maintenance_waits_interval,
            "retention": self.maintenance_retention_interval,
            "metrics": self.maintenance_metrics_interval,
            "periodic": self.maintenance_periodic_interval or self.timer_interval,
            "timers": self.timer_interval,
            "result_orphans": self.results_sweep_interval,
            "claim_heads": self.maintenance_claim_heads_interval,
        }[chore]
        return self.sweep_interval if own is None else own

    @property
    def sweep_queue(self) -> str:
        return self.queue + ".sweep"

    @staticmethod
    def env_name(field_name: str) -> str:
        """The environment variable of a field."""
        alias = Settings.model_fields[field_name].validation_alias
        return alias if isinstance(alias, str) else "SPACEJOBS_" + field_name.upper()


def markdown_table() -> str:
    """The configuration table of docs/reference/configuration.md, made from the fields above (a test keeps
    them equal). ``python -m models.settings`` prints it; paste it between the markers there.
    """
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if default is None or default == "":
            shown = "—"
        elif isinstance(default, bool):
            shown = "1" if default else "0"
        else:
            shown = f"`{default}`"
        lines.append(f"| `{Settings.env_name(name)}` | {shown} | {field.description} |")
    return "\n".join(lines)


_current: Settings | None = None


def get_settings() -> Settings:
    """The settings of this process, read from the environment on first use (or those
    :func:`configure` set)."""
    global _current
    if _current is None:
        _current = Settings()
    return _current


def reload_settings() -> Settings:
    """Read the environment again (tests and ``spacejobs demo`` change it before starting)."""
    global _current
    _current = None
    return get_settings()


def configure(values: Mapping[str, object]) -> Settings:
    """Make the process's settings the environment's with ``values`` over them, each named as
    its environment variable (``SPACEJOBS_QUEUE``, ``DATABASE_URL``): a Flask application's own
    ``app.config`` (spacejobs.webapp.extension). Names that are not settings are left alone."""
    global _current
    fields = {Settings.env_name(name): name for name in Settings.model_fields}
    given: dict[str, Any] = {}
    for env_name, value in values.items():
        name = fields.get(env_name)
        if name is not None:
            alias = Settings.model_fields[name].validation_alias
            given[alias if isinstance(alias, str) else name] = value
    _current = Settings(**given)
    return _current


if __name__ == "__main__":
    print(markdown_table())
