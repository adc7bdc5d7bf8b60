-- Operations, revision 0003: worker presence, per-kind controls, the operator audit log,
-- retry lineage and monotonic metric counters.

ALTER TABLE jobs ADD COLUMN retry_of uuid REFERENCES jobs (id) ON DELETE SET NULL;

-- One row per worker process (a Celery pool child, or the main process of a solo pool). The
-- dashboard calls it offline after a documented silence; nothing here is tenant data.
CREATE TABLE worker_processes (
    id             text PRIMARY KEY,            -- '<host>:<pid>', as in jobs.leased_by
    node           text NOT NULL,               -- the Celery node name
    hostname       text NOT NULL,
    pid            integer NOT NULL,
    version        text NOT NULL,
    queues         text[] NOT NULL DEFAULT '{}',
    kinds          text[] NOT NULL DEFAULT '{}',
    concurrency    integer NOT NULL DEFAULT 1,
    running        integer NOT NULL DEFAULT 0,
    processed      bigint NOT NULL DEFAULT 0,
    failed         bigint NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    stopped_at     timestamptz
);
CREATE INDEX worker_processes_seen_idx ON worker_processes (last_seen_at);

-- Operator controls per kind, honoured by every claim on every host.
CREATE TABLE kind_settings (
    kind               text PRIMARY KEY,
    paused             boolean NOT NULL DEFAULT false,
    concurrency_limit  integer CHECK (concurrency_limit IS NULL OR concurrency_limit >= 0),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    updated_by         uuid REFERENCES users (id)
);

CREATE TABLE operator_audit (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operator_id  uuid NOT NULL REFERENCES users (id),
    action       text NOT NULL,
    target       text NOT NULL,
    detail       jsonb NOT NULL DEFAULT '{}',
    request_id   text,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operator_audit_at_idx ON operator_audit (at DESC);

-- Prometheus counters must never go down, and retention deletes jobs: so finished-job counts
-- and histogram observations are recorded as jobs move. Recording is an append-only INSERT into
-- metric_events (no shared row to lock, so two claims never wait on each other's counters); the
-- sweeper folds them into metric_counters in bounded batches, and /metrics adds both.
CREATE TABLE metric_events (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name   text NOT NULL,
    kind   text NOT NULL,
    label  text NOT NULL DEFAULT '',
    value  double precision NOT NULL
);

CREATE TABLE metric_counters (
    name    text NOT NULL,
    kind    text NOT NULL,
    label   text NOT NULL DEFAULT '',
    value   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (name, kind, label)
);

CREATE FUNCTION bump_metric(p_name text, p_kind text, p_label text, p_by double precision)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO metric_events (name, kind, label, value) VALUES (p_name, p_kind, p_label, p_by)
$$;

-- Histogram bucket bounds (seconds), shared by queue-wait and duration (and models/metrics.py).
CREATE FUNCTION metric_buckets() RETURNS double precision[] LANGUAGE sql IMMUTABLE AS
$$ SELECT ARRAY[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800]::double precision[] $$;

-- The bucket label of a value: the smallest bound that holds it. Stored per bucket, not
-- cumulatively; /metrics accumulates on read.
CREATE FUNCTION metric_bucket(seconds double precision) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((SELECT min(b) FROM unnest(metric_buckets()) AS b WHERE seconds <= b)::text,
                    '+Inf')
$$;

CREATE FUNCTION fold_metric_events(batch integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    folded integer;
BEGIN
    WITH taken AS (
        DELETE FROM metric_events WHERE id IN (
            SELECT id FROM metric_events ORDER BY id LIMIT batch FOR UPDATE SKIP LOCKED)
        RETURNING name, kind, label, value
    ), summed AS (
        SELECT name, kind, label, sum(value) AS value, count(*) AS n FROM taken
        GROUP BY name, kind, label
    ), upserted AS (
        INSERT INTO metric_counters (name, kind, label, value)
        SELECT name, kind, label, value FROM summed
        ON CONFLICT (name, kind, label) DO UPDATE SET value = metric_counters.value + excluded.value
        RETURNING 1
    )
    -- A data-modifying CTE runs to completion whether or not it is read.
    SELECT coalesce(sum(n), 0) INTO folded FROM summed;
    RETURN folded;
END $$;
REVOKE ALL ON FUNCTION fold_metric_events(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fold_metric_events(integer) TO space_worker;

CREATE FUNCTION jobs_count_metrics() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wait_s double precision;
    run_s double precision;
    expired boolean;
BEGIN
    IF NEW.status = OLD.status AND NEW.attempts = OLD.attempts THEN
        RETURN NULL;
    END IF;
    -- queue wait: created → first lease; duration: first lease → finish
    IF OLD.status = 'queued' AND NEW.status = 'leased' AND OLD.attempts = 0 THEN
        wait_s := extract(epoch FROM clock_timestamp() - NEW.created_at);
    END IF;
    IF NEW.status IN ('completed', 'failed', 'cancelled') AND NEW.status <> OLD.status
       AND NEW.started_at IS NOT NULL THEN
        run_s := extract(epoch FROM clock_timestamp() - NEW.started_at);
    END IF;
    expired := OLD.status IN ('leased', 'cancel_requested') AND OLD.lease_until < now()
               AND (NEW.status <> OLD.status OR NEW.lease_token IS DISTINCT FROM OLD.lease_token);
    -- One INSERT per transition, whatever it records (the claim and the finish are hot paths).
    INSERT INTO metric_events (name, kind, label, value)
    SELECT m.name, NEW.kind, m.label, m.value FROM (VALUES
        ('spacejobs_job_queue_wait_seconds_bucket', metric_bucket(wait_s), 1.0, wait_s IS NOT NULL),
        ('spacejobs_job_queue_wait_seconds_sum', '', wait_s, wait_s IS NOT NULL),
        ('spacejobs_jobs_finished_total', NEW.status, 1.0,
            NEW.status IN ('completed', 'failed', 'cancelled') AND NEW.status <> OLD.status),
        ('spacejobs_job_duration_seconds_bucket', metric_bucket(run_s), 1.0, run_s IS NOT NULL),
        ('spacejobs_job_duration_seconds_sum', '', run_s, run_s IS NOT NULL),
        ('spacejobs_leases_expired_total', '', 1.0, expired)
    ) AS m (name, label, value, wanted)
    WHERE m.wanted;
    RETURN NULL;
END $$;

-- SECURITY DEFINER: every role that moves a job counts it, none may write counters directly.
ALTER FUNCTION jobs_count_metrics() SECURITY DEFINER SET search_path = public, pg_temp;

CREATE TRIGGER jobs_count_metrics AFTER UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_count_metrics();

-- Counters bumped from Python (stale finishes fenced, wake-ups published or failed) go
-- through this one narrow door.
CREATE FUNCTION count_event(p_name text, p_kind text, p_by double precision)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT bump_metric(p_name, p_kind, '', p_by)
    WHERE p_name IN ('spacejobs_stale_finishes_fenced_total', 'spacejobs_wakeups_published_total',
                     'spacejobs_wakeups_failed_total')
$$;
REVOKE ALL ON FUNCTION count_event(text, text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION count_event(text, text, double precision) TO space_app, space_worker;
REVOKE ALL ON FUNCTION bump_metric(text, text, text, double precision) FROM PUBLIC;

GRANT SELECT, INSERT, UPDATE ON worker_processes TO space_worker;
GRANT SELECT ON worker_processes, kind_settings, operator_audit, metric_counters, metric_events
    TO space_operator;
GRANT SELECT ON kind_settings TO space_worker;
GRANT SELECT, INSERT, UPDATE ON kind_settings TO space_app;
GRANT INSERT ON operator_audit TO space_app;
GRANT SELECT (retry_of) ON jobs TO space_operator;

-- The claim counts a limited kind's running jobs through this index.
CREATE INDEX jobs_running_kind_idx ON jobs (kind) WHERE status IN ('leased', 'cancel_requested');
