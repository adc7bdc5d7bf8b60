-- Operations: worker presence, kind controls, the operators' audit, metric counters and the
-- functions that record them. None of it is tenant data: grants are its whole protection.

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
-- Workers seen recently: the dashboard's list and /metrics' online count (ops/*.sql workers).
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
-- The dashboard's audit log, newest first (ops/dashboard.sql audit).
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

-- =============================================================================================
-- Metric functions
-- =============================================================================================

-- PostgreSQL lets PUBLIC execute a new function: the SECURITY DEFINER ones and the raw counter
-- bump are each opened to exactly the roles that need them, below each function.

-- Owner-only (no grant): reached through count_event().
CREATE FUNCTION bump_metric(p_name text, p_kind text, p_label text, p_by double precision)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO metric_events (name, kind, label, value) VALUES (p_name, p_kind, p_label, p_by)
$$;
REVOKE ALL ON FUNCTION bump_metric(text, text, text, double precision) FROM PUBLIC;

-- Histogram bucket bounds (seconds), shared by queue-wait and duration (and models/ops/metrics.py).
CREATE FUNCTION metric_buckets() RETURNS double precision[] LANGUAGE sql IMMUTABLE AS
$$ SELECT ARRAY[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800]::double precision[] $$;

-- The bucket label of a value: the smallest bound that holds it (stored per bucket, not
-- cumulatively; /metrics accumulates on read). A plain CASE, because an SQL function made of
-- one expression is inlined into the statement that calls it: the batch triggers call it per
-- row. The bounds are metric_buckets()'s, which a test checks one by one.
CREATE FUNCTION metric_bucket(seconds double precision) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN seconds IS NULL THEN NULL
        WHEN seconds <= 0.005 THEN '0.005' WHEN seconds <= 0.01 THEN '0.01'
        WHEN seconds <= 0.025 THEN '0.025' WHEN seconds <= 0.05 THEN '0.05'
        WHEN seconds <= 0.1 THEN '0.1' WHEN seconds <= 0.25 THEN '0.25'
        WHEN seconds <= 0.5 THEN '0.5' WHEN seconds <= 1 THEN '1'
        WHEN seconds <= 2.5 THEN '2.5' WHEN seconds <= 5 THEN '5'
        WHEN seconds <= 10 THEN '10' WHEN seconds <= 30 THEN '30'
        WHEN seconds <= 60 THEN '60' WHEN seconds <= 300 THEN '300'
        WHEN seconds <= 1800 THEN '1800'
        ELSE '+Inf' END
$$;

-- The sweeper's fold of metric_events into metric_counters, in bounded batches, of the events
-- after p_after (NULL: from the first); last_id is where the next fold may start (p_after when
-- nothing was folded). SECURITY DEFINER: the worker may neither read nor delete metric_events
-- itself. Behind a long-open transaction the table keeps every event folded since it began, and
-- a fold from the first id read them all, every run. An event the fold passes by (its
-- transaction committed after a later id was folded, or another sweeper's fold of it rolled
-- back) waits for a fold from the first, which the sweeper makes every so often; /metrics adds
-- the events not folded yet, so a late fold changes no figure.
CREATE FUNCTION fold_metric_events(batch integer, p_after bigint)
RETURNS TABLE (folded integer, last_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- The events by their key, from p_after on, whatever the statistics say: a sequential scan (or
-- a hash join with one) reads every event a long-open transaction keeps.
SET enable_seqscan = off SET enable_bitmapscan = off AS $$
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT e.id FROM metric_events e WHERE e.id > coalesce(p_after, 0)
        ORDER BY e.id LIMIT batch FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM metric_events m WHERE m.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING m.id, m.name, m.kind, m.label, m.value
    ), summed AS (
        SELECT t.name, t.kind, t.label, sum(t.value) AS value FROM taken t
        GROUP BY t.name, t.kind, t.label
    ), upserted AS (
        INSERT INTO metric_counters (name, kind, label, value)
        SELECT s.name, s.kind, s.label, s.value FROM summed s
        ON CONFLICT (name, kind, label) DO UPDATE SET value = metric_counters.value + excluded.value
        RETURNING 1
    )
    -- A data-modifying CTE runs to completion whether or not it is read.
    SELECT count(*)::integer, coalesce(max(t.id), p_after) FROM taken t;
END $$;
REVOKE ALL ON FUNCTION fold_metric_events(integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fold_metric_events(integer, bigint) TO space_worker;

-- The previous release's sweeper, during a rolling deploy: from the first event.
CREATE FUNCTION fold_metric_events(batch integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT f.folded FROM fold_metric_events(batch, NULL) AS f
$$;
REVOKE ALL ON FUNCTION fold_metric_events(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fold_metric_events(integer) TO space_worker;

-- Counters bumped from Python (wake-ups published or failed) go through this one narrow door:
-- two names, a positive finite amount (a flush's sum), and no label. A caller cannot make a
-- counter go down (every rate() would read a reset), poison it with NaN or Infinity, or add a
-- series: the only labels any counter has are what the database itself knows (the kinds of its
-- jobs; the stale finishes are counted by complete_jobs(), which sees them). p_kind stays in
-- the signature for the callers of the previous release, and must be ''.
CREATE FUNCTION count_event(p_name text, p_kind text, p_by double precision)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT bump_metric(p_name, '', '', p_by)
    WHERE p_name IN ('spacejobs_wakeups_published_total', 'spacejobs_wakeups_failed_total')
      AND p_by > 0 AND p_by <= 1e9 AND p_kind = ''
$$;
REVOKE ALL ON FUNCTION count_event(text, text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION count_event(text, text, double precision) TO space_app, space_worker;

-- =============================================================================================
-- Grants
-- =============================================================================================

-- space_app: kind controls and the operators' audit are the operators' actions, which the web
-- performs after @operator_only.
GRANT SELECT, INSERT, UPDATE ON kind_settings TO space_app;
GRANT INSERT ON operator_audit TO space_app;

-- space_worker: its own presence row; kind controls read by every claim.
GRANT SELECT, INSERT, UPDATE ON worker_processes TO space_worker;
GRANT SELECT ON kind_settings TO space_worker;

GRANT SELECT ON worker_processes, kind_settings, operator_audit, metric_counters, metric_events
    TO space_operator;

-- The one writer of job_rate_limits: the limit of one kind in one organization, or (p_max_starts
-- NULL) none, so the kind's own applies again. The owner's alone: the CLI calls it as the owner,
-- the dashboard through set_rate_limit().
CREATE FUNCTION put_rate_limit(p_organization_id uuid, p_kind text, p_max_starts integer,
                               p_per_seconds integer)
RETURNS void LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    IF p_max_starts IS NULL THEN
        DELETE FROM job_rate_limits r
        WHERE r.organization_id = p_organization_id AND r.kind = p_kind;
    ELSE
        INSERT INTO job_rate_limits (organization_id, kind, max_starts, per_seconds)
        VALUES (p_organization_id, p_kind, p_max_starts, p_per_seconds)
        ON CONFLICT (organization_id, kind) DO UPDATE
        SET max_starts = excluded.max_starts, per_seconds = excluded.per_seconds,
            updated_at = now();
    END IF;
END $$;
REVOKE ALL ON FUNCTION put_rate_limit(uuid, text, integer, integer) FROM PUBLIC;

-- An operator's rate limit from the dashboard (which runs as space_app, like the other operator
-- actions): it checks that the caller names an operator, and writes the operator audit line in
-- the same transaction.
CREATE FUNCTION set_rate_limit(p_operator_id uuid, p_organization_id uuid, p_kind text,
                               p_max_starts integer, p_per_seconds integer, p_request_id text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM users u WHERE u.id = p_operator_id AND u.is_operator) THEN
        RAISE EXCEPTION 'only an operator sets rate limits' USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM put_rate_limit(p_organization_id, p_kind, p_max_starts, p_per_seconds);
    INSERT INTO operator_audit (operator_id, action, target, detail, request_id)
    VALUES (p_operator_id, 'rate_limit', p_organization_id::text,
            jsonb_build_object('kind', p_kind, 'max_starts', p_max_starts,
                               'per_seconds', p_per_seconds),
            p_request_id);
END $$;
REVOKE ALL ON FUNCTION set_rate_limit(uuid, uuid, text, integer, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION set_rate_limit(uuid, uuid, text, integer, integer, text) TO space_app;
