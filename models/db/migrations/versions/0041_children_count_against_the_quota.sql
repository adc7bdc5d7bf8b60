-- Every child counts against the quota: a workflow's steps are admitted with the workflow and a
-- fan-out's items (or a kind's own workflow's steps) when it starts, and counted as active from
-- then on (job_reservations), each child taking its place when it is made. The organization's
-- default cap is the database's (quota_policy), no longer a caller's argument; a debounce names
-- the requester it replaced.

-- The cap on every organization's active jobs, unless job_quotas says otherwise: a policy the
-- database holds, like retention_policy, so that no caller of the submit functions can choose it
-- (`spacejobs db upgrade` writes SPACEJOBS_ACTIVE_JOBS_QUOTA into it when set). The owner's alone.
CREATE TABLE quota_policy (
    -- one row: the policy of this database
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    active_jobs  integer NOT NULL DEFAULT 1000 CHECK (active_jobs >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO quota_policy DEFAULT VALUES;

-- The children a parent will make and has not made yet (a workflow's steps, a fan-out's
-- items), counted as active in advance: the whole plan is admitted against the quotas when it
-- is submitted (a workflow) or started (start_fan_out(), start_workflow()), and each child made
-- later takes its place here (release_children(), release_steps()). One row per parent and
-- kind. Its triggers keep active_job_counts in step with it (40_job_transitions.sql); the jobs
-- triggers drop a parent's rows when it ends or is deleted, hence no foreign key, as for
-- active_job_counts. The owner's alone.
CREATE TABLE job_reservations (
    parent_id        uuid NOT NULL,
    organization_id  uuid NOT NULL,
    kind             text NOT NULL,
    reserved         integer NOT NULL CHECK (reserved >= 0),
    PRIMARY KEY (parent_id, kind)
);

-- quota_policy and job_reservations: the owner's alone (the submit and start functions read and
-- write them as the owner).
ALTER TABLE quota_policy ENABLE ROW LEVEL SECURITY;
ALTER TABLE quota_policy FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON quota_policy TO space_owner USING (true) WITH CHECK (true);
ALTER TABLE job_reservations ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_reservations FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_reservations TO space_owner USING (true) WITH CHECK (true);

-- Reservations count as active jobs of their kind (30_jobs.sql job_reservations): whatever
-- writes them, these triggers move active_job_counts by the same amount in the same statement.
CREATE FUNCTION job_reservations_counted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM add_active_jobs(array_agg(n.organization_id), array_agg(n.kind), array_agg(n.reserved))
        FROM new_reservations n;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM add_active_jobs(array_agg(n.organization_id), array_agg(n.kind),
                                array_agg(n.reserved - o.reserved))
        FROM new_reservations n JOIN old_reservations o
             ON o.parent_id = n.parent_id AND o.kind = n.kind;
    ELSE
        PERFORM add_active_jobs(array_agg(o.organization_id), array_agg(o.kind), array_agg(-o.reserved))
        FROM old_reservations o;
    END IF;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION job_reservations_counted() FROM PUBLIC;

CREATE TRIGGER job_reservations_inserted AFTER INSERT ON job_reservations
    REFERENCING NEW TABLE AS new_reservations
    FOR EACH STATEMENT EXECUTE FUNCTION job_reservations_counted();
CREATE TRIGGER job_reservations_updated AFTER UPDATE ON job_reservations
    REFERENCING OLD TABLE AS old_reservations NEW TABLE AS new_reservations
    FOR EACH STATEMENT EXECUTE FUNCTION job_reservations_counted();
CREATE TRIGGER job_reservations_deleted AFTER DELETE ON job_reservations
    REFERENCING OLD TABLE AS old_reservations
    FOR EACH STATEMENT EXECUTE FUNCTION job_reservations_counted();

-- The counts again from the jobs and the reservations themselves, for a database whose rows
-- were written with the triggers disabled (pg_restore --disable-triggers). The owner runs it;
-- writers wait meanwhile.
CREATE OR REPLACE FUNCTION recount_active_jobs() RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE jobs IN SHARE MODE;
    LOCK TABLE job_reservations IN SHARE MODE;
    LOCK TABLE active_job_counts IN EXCLUSIVE MODE;
    DELETE FROM active_job_counts;
    INSERT INTO active_job_counts (organization_id, kind, slot, active)
    SELECT c.organization_id, c.kind, 0, sum(c.n) FROM (
        SELECT j.organization_id, j.kind, count(*) AS n FROM jobs j
        WHERE j.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
        GROUP BY j.organization_id, j.kind
        UNION ALL
        SELECT r.organization_id, r.kind, sum(r.reserved) FROM job_reservations r
        GROUP BY r.organization_id, r.kind) AS c
    GROUP BY c.organization_id, c.kind;
END $$;
REVOKE ALL ON FUNCTION recount_active_jobs() FROM PUBLIC;

-- Updated jobs: an event per status change (and per re-lease after expiry, which is a new
-- attempt), and the metric events, summed per statement: a batch of 100 finishes adds one
-- 'finished' row with value 100, not 100 rows. Jobs that stop being active leave
-- active_job_counts in the same statement.
CREATE OR REPLACE FUNCTION jobs_after_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- PL/pgSQL keeps each statement's first plan for the session, and a transition table has no
-- statistics: a plan made for a one-row update joined new_jobs to old_jobs by nested loop ever
-- after, comparing every new row with every old one (revision 0022). Hash joins instead, and
-- no JIT: the cost of the LATERAL's nested loop, disabled but still the only way, would pass
-- jit_above_cost and LLVM would compile the metrics statement on every call (~300 ms).
SET enable_nestloop = off SET jit = off AS $$
BEGIN
    INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor)
    SELECT n.id, n.organization_id, o.status, n.status, n.attempts,
           coalesce(nullif(current_setting('app.actor', true), ''), current_user)
    FROM new_jobs n JOIN old_jobs o ON o.id = n.id
    WHERE n.status <> o.status OR n.attempts <> o.attempts;

    INSERT INTO metric_events (name, kind, label, value)
    SELECT m.name, t.kind, m.label, sum(m.value)
    FROM (
        SELECT n.kind,
               -- queue wait: created -> first lease; duration: first lease -> finish
               CASE WHEN o.status = 'queued' AND n.status = 'leased' AND o.attempts = 0
                    THEN extract(epoch FROM clock_timestamp() - n.created_at) END AS wait_s,
               CASE WHEN n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status
                         AND n.started_at IS NOT NULL
                    THEN extract(epoch FROM clock_timestamp() - n.started_at) END AS run_s,
               CASE WHEN n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status
                    THEN n.status END AS finished_as,
               o.status IN ('leased', 'cancel_requested') AND o.lease_until < now()
                   AND (n.status <> o.status OR n.lease_token IS DISTINCT FROM o.lease_token) AS expired
        FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE n.status <> o.status OR n.attempts <> o.attempts
    ) AS t
    CROSS JOIN LATERAL (VALUES
        ('spacejobs_job_queue_wait_seconds_bucket', metric_bucket(t.wait_s), 1.0, t.wait_s IS NOT NULL),
        ('spacejobs_job_queue_wait_seconds_sum', '', t.wait_s, t.wait_s IS NOT NULL),
        ('spacejobs_jobs_finished_total', t.finished_as, 1.0, t.finished_as IS NOT NULL),
        ('spacejobs_job_duration_seconds_bucket', metric_bucket(t.run_s), 1.0, t.run_s IS NOT NULL),
        ('spacejobs_job_duration_seconds_sum', '', t.run_s, t.run_s IS NOT NULL),
        ('spacejobs_leases_expired_total', '', 1.0, t.expired)
    ) AS m (name, label, value, wanted)
    WHERE m.wanted
    GROUP BY m.name, t.kind, m.label;

    PERFORM add_active_jobs(array_agg(c.organization_id), array_agg(c.kind), array_agg(c.delta))
    FROM (SELECT o.organization_id, o.kind, -1 AS delta FROM old_jobs o
          WHERE o.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
          UNION ALL
          SELECT n.organization_id, n.kind, 1 FROM new_jobs n
          WHERE n.status IN ('queued', 'leased', 'cancel_requested', 'waiting')) AS c;

    -- A parent that ended makes no more children: what it had reserved for those it never made
    -- stops counting (its reservations' trigger takes the counts back). Looked for only while
    -- any parent holds a reservation.
    IF EXISTS (SELECT 1 FROM job_reservations) THEN
        DELETE FROM job_reservations r
        USING new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE r.parent_id = n.id AND n.status IN ('completed', 'failed', 'cancelled')
          AND o.status <> n.status;
    END IF;

    -- Parents waiting for their children: a child that ended lets its parent go on (spawn the
    -- next ones, or collect). The parents' rows are locked first, in id order, so a parent
    -- going to wait at this moment (wait_job() locks its row too) either waits before this
    -- and is resumed here, or counts this child as ended when it looks. A fan-out or a
    -- workflow the database runs (70_fan_out.sql) counts the ends and makes its next children
    -- here, in the transaction that ended these; its parent goes on only once it is settled
    -- (the last child ended; for a fail_fast workflow, also a step that did not complete).
    -- (Only when a child ended: the resume below is an UPDATE of jobs too, and this trigger,
    -- which then runs for it, must find nothing to do.)
    IF EXISTS (SELECT 1 FROM new_jobs n JOIN old_jobs o ON o.id = n.id
               WHERE n.parent_id IS NOT NULL AND n.status <> o.status
                 AND n.status IN ('completed', 'failed', 'cancelled')) THEN
        PERFORM 1 FROM jobs p
        WHERE p.id IN (SELECT n.parent_id FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                       WHERE n.parent_id IS NOT NULL AND n.status <> o.status
                         AND n.status IN ('completed', 'failed', 'cancelled'))
        ORDER BY p.id FOR UPDATE;
        PERFORM fan_out_children_ended(array_agg(n.parent_id)),
                workflow_steps_ended(array_agg(n.parent_id), array_agg(n.child_index),
                                     array_agg(n.status = 'completed'))
        FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE n.parent_id IS NOT NULL AND n.status <> o.status
          AND n.status IN ('completed', 'failed', 'cancelled');
        UPDATE jobs p SET status = 'queued', run_after = now(), last_wakeup_at = NULL
        WHERE p.status = 'waiting' AND p.wait_children IS NOT NULL
          AND p.id IN (SELECT n.parent_id FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                       WHERE n.parent_id IS NOT NULL AND n.status <> o.status
                         AND n.status IN ('completed', 'failed', 'cancelled'))
          AND NOT EXISTS (SELECT 1 FROM job_fan_outs f
                          WHERE f.parent_id = p.id AND f.ended < f.total)
          AND NOT EXISTS (SELECT 1 FROM job_workflows w
                          WHERE w.parent_id = p.id AND w.ended < w.released
                            AND NOT (w.policy = 'fail_fast' AND w.failed > 0));
        IF FOUND THEN
            PERFORM pg_notify('spacejobs_jobs', '');
        END IF;
    END IF;

    -- Jobs that just ended, for whoever waits on them (models/jobs/waiting.py): their ids, at
    -- most 200 to a notification (a payload holds 8,000 bytes). Delivered at COMMIT, like the
    -- row itself; a waiter re-reads the row, the truth, in any case.
    PERFORM pg_notify('spacejobs_finished', chunk.ids)
    FROM (SELECT string_agg(e.id::text, ',') AS ids
          FROM (SELECT n.id, (row_number() OVER ()) / 200 AS part
                FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                WHERE n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status) e
          GROUP BY e.part) AS chunk;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobs_after_update() FROM PUBLIC;

-- A job's events and its count as active go with it: retention, an organization's deletion
-- (cascading to its jobs), TRUNCATE.
CREATE OR REPLACE FUNCTION jobs_after_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM job_events e USING gone_jobs g WHERE e.job_id = g.id;
    PERFORM add_active_jobs(array_agg(g.organization_id), array_agg(g.kind), array_agg(-1))
    FROM gone_jobs g WHERE g.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    DELETE FROM job_reservations r USING gone_jobs g WHERE r.parent_id = g.id;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobs_after_delete() FROM PUBLIC;

CREATE OR REPLACE FUNCTION jobs_after_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    TRUNCATE job_events;
    TRUNCATE job_reservations;
    TRUNCATE active_job_counts;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobs_after_truncate() FROM PUBLIC;

-- The kinds of the steps a submitted workflow (a job of the kind 'workflow', whose params hold
-- its steps: models/jobs/workflows.py) will make, one entry per step; empty for any other job.
-- Read from the params the database stores, never from the caller: what is admitted and
-- reserved is exactly what the workflow's run will make.
CREATE FUNCTION workflow_step_kinds(p_kind text, p_params jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_kind = 'workflow' AND jsonb_typeof(p_params -> 'steps') = 'array'
                THEN ARRAY(SELECT s.step ->> 'kind'
                           FROM jsonb_array_elements(p_params -> 'steps') AS s (step))
                ELSE '{}'::text[] END
$$;

-- Count the children a parent will make (p_kinds: one entry per child) as active jobs of
-- their kinds from now on, until each is made or the parent ends (30_jobs.sql
-- job_reservations). The caller has admitted them.
CREATE FUNCTION reserve_children(p_parent uuid, p_organization_id uuid, p_kinds text[])
RETURNS void LANGUAGE sql SET search_path = public, pg_temp AS $$
    INSERT INTO job_reservations AS r (parent_id, organization_id, kind, reserved)
    SELECT p_parent, p_organization_id, k.kind, count(*)
    FROM unnest(p_kinds) AS k (kind)
    GROUP BY k.kind
    ON CONFLICT ON CONSTRAINT job_reservations_pkey
        DO UPDATE SET reserved = r.reserved + excluded.reserved
$$;
REVOKE ALL ON FUNCTION reserve_children(uuid, uuid, text[]) FROM PUBLIC;

DROP FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text, text, text,
                         timestamptz, uuid, integer, integer, integer, text, text, integer);
-- Called by name (models/jobs/store.sql: `p_kind => ...`), so no caller depends on the order
-- of sixteen arguments, three of them text side by side that a positional slip would swap
-- without an error. The optional ones default to NULL ("none"), so a caller leaves out what it
-- does not use, and a later optional argument (DROP + CREATE with a default) does not break a
-- caller that does not pass it, such as the previous release's web during a rolling deploy.
-- Not one jsonb or composite argument: each value keeps its PostgreSQL type, checked at the
-- call before the body runs, and a composite type would be one more object whose fields are
-- positional again.
--
-- outcome: 'created', 'replayed' (an Idempotency-Key seen before: the first job is answered,
-- whatever the quota), 'debounced' (p_debounce_seconds: a queued, never started job with the
-- dedup_key took these params and starts p_debounce_seconds from now; it is answered),
-- 'duplicate' (an active job has the dedup_key: its id is answered),
-- 'over_quota' (nothing written; quota_kind and quota_limit say which cap), or 'refused' (the
-- requester's role and the organization's state are answered, NULL for a non-member, so the
-- caller can say why in its own words).
CREATE FUNCTION submit_job(
    p_organization_id uuid, p_requested_by uuid, p_kind text, p_params jsonb,
    p_max_attempts integer, p_lease_seconds integer, p_org_states text[], p_role text,
    p_dedup_key text DEFAULT NULL, p_idempotency_key text DEFAULT NULL,
    p_request_id text DEFAULT NULL, p_run_after timestamptz DEFAULT NULL,
    p_retry_of uuid DEFAULT NULL, p_org_quota integer DEFAULT NULL,
    p_kind_quota integer DEFAULT NULL, p_priority integer DEFAULT NULL,
    p_traceparent text DEFAULT NULL, p_sequence_key text DEFAULT NULL,
    p_debounce_seconds integer DEFAULT NULL, p_quota_kinds text[] DEFAULT NULL,
    p_quota_caps integer[] DEFAULT NULL)
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb,
    quota_kind text, quota_limit integer, sequence_key text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    -- before the FOR SHARE below, which takes a transaction id without writing a job
    first_write CONSTANT boolean := pg_current_xact_id_if_assigned() IS NULL;
    -- a workflow's steps: admitted with it, and counted as active from now on
    step_kinds CONSTANT text[] := workflow_step_kinds(p_kind, p_params);
    standing record;
    refusal record;
    made jobs;
    replaced_requester uuid;
BEGIN
    SELECT m.role, o.state INTO standing
    FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = p_organization_id AND m.user_id = p_requested_by
    FOR SHARE OF m, o;
    IF NOT FOUND OR standing.state <> ALL (p_org_states)
       OR role_rank(standing.role) < role_rank(p_role) THEN
        RETURN QUERY SELECT 'refused', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, NULL, NULL::integer, NULL;
        RETURN;
    END IF;

    IF p_sequence_key IS NOT NULL THEN
        -- One submit of a sequence at a time, each taking its place after the last one's
        -- commit: were two in flight, the later place could commit first, run, and then the
        -- earlier one start beside it (the claim sees only what has committed).
        PERFORM pg_advisory_xact_lock(hashtext('spacejobs.sequence:' || p_organization_id::text
                                               || ':' || p_sequence_key));
    END IF;
    -- (Never a workflow: its steps were admitted and reserved with it, and new params would
    -- bring other steps.)
    IF p_debounce_seconds IS NOT NULL AND p_dedup_key IS NOT NULL
       AND cardinality(step_kinds) = 0 THEN
        -- The queued, never started job with this key takes the new params and moves its
        -- start. Debounces of one key take turns (the lock, until commit), so each sees the
        -- job the one before made; a claim that leases the job first (its row lock, then a
        -- status this no longer matches) leaves nothing to update, and a new job is made.
        PERFORM pg_advisory_xact_lock(hashtext('spacejobs.debounce:' || p_organization_id::text
                                               || ':' || p_kind || ':' || p_dedup_key));
        SELECT j.id, j.requested_by INTO made.id, replaced_requester FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.kind = p_kind
          AND j.dedup_key = p_dedup_key AND j.debounce_seconds IS NOT NULL
          AND j.status = 'queued' AND j.attempts = 0
        FOR UPDATE;
        IF made.id IS NOT NULL THEN
            UPDATE jobs j
            SET params = p_params, requested_by = p_requested_by,
                run_after = now() + p_debounce_seconds * interval '1 second',
                debounce_seconds = p_debounce_seconds, request_id = p_request_id
            WHERE j.id = made.id
            RETURNING * INTO made;
            -- Both requesters: the actor, and as the entry's member the one whose job it was,
            -- when that was someone else (their job now runs for the actor).
            INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, member_id,
                                   detail, request_id)
            VALUES (p_organization_id, coalesce(app_user(), p_requested_by),
                    coalesce(app_actor(), 'user:' || p_requested_by), 'job.debounce', made.id,
                    nullif(replaced_requester, p_requested_by),
                    jsonb_build_object('kind', p_kind), p_request_id);
            RETURN QUERY SELECT 'debounced', standing.role, standing.state, made.id,
                made.organization_id, made.requested_by, made.kind, made.status, made.attempts,
                made.max_attempts, made.progress, made.error_code, made.error_message,
                made.dedup_key, made.run_after, made.created_at, made.updated_at,
                made.started_at, made.finished_at, made.cancel_requested_at, made.leased_by,
                made.lease_until, made.result_expired_at, made.params, NULL, NULL::integer,
                made.sequence_key;
            RETURN;
        END IF;
    END IF;

    -- A replay answers the first job even at the cap: it asks for nothing new.
    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO made FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
          AND j.idempotency_key = p_idempotency_key;
    END IF;
    IF made.id IS NULL THEN
        -- The organization's cap is the database's (quota_policy, job_quotas); p_org_quota is
        -- ignored (kept for the previous release's callers during a rolling deploy). A kind's
        -- declared cap is the caller's, as its other rules are: p_kind_quota for the job's own
        -- kind, p_quota_caps for the kinds of its steps (p_quota_kinds).
        SELECT * INTO refusal
        FROM admit_jobs(p_organization_id, ARRAY[p_kind] || step_kinds,
                        ARRAY[p_kind_quota] || ARRAY(
                            SELECT c.cap FROM unnest(step_kinds) WITH ORDINALITY AS k (kind, n)
                            LEFT JOIN unnest(p_quota_kinds, p_quota_caps) AS c (kind, cap)
                                   ON c.kind = k.kind
                            ORDER BY k.n),
                        (SELECT q.active_jobs FROM quota_policy q), first_write);
        IF FOUND THEN
            RETURN QUERY SELECT 'over_quota', standing.role, standing.state, NULL::uuid,
                NULL::uuid, NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb,
                NULL, NULL, NULL, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz,
                NULL::timestamptz, NULL::jsonb, refusal.refused_kind, refusal.cap, NULL;
            RETURN;
        END IF;

        INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts,
                          lease_seconds, dedup_key, idempotency_key, request_id, run_after,
                          retry_of, priority, traceparent, sequence_key, sequence_position,
                          debounce_seconds)
        VALUES (p_organization_id, p_requested_by, p_kind, p_params,
                least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
                p_dedup_key, p_idempotency_key, p_request_id,
                CASE WHEN p_debounce_seconds IS NOT NULL AND p_dedup_key IS NOT NULL
                     THEN greatest(coalesce(p_run_after, now()),
                                   now() + p_debounce_seconds * interval '1 second')
                     ELSE coalesce(p_run_after, now()) END,
                -- an operator's retry-as-new-job points back at the job it retries, in its org
                (SELECT r.id FROM jobs r WHERE r.id = p_retry_of
                                            AND r.organization_id = p_organization_id),
                -- out of range is the column CHECK's refusal, never a silent clamp
                coalesce(p_priority, 0), p_traceparent, p_sequence_key,
                CASE WHEN p_sequence_key IS NOT NULL THEN nextval('job_sequence_positions') END,
                CASE WHEN p_dedup_key IS NOT NULL AND cardinality(step_kinds) = 0
                     THEN p_debounce_seconds END)
        ON CONFLICT DO NOTHING
        RETURNING * INTO made;
        IF made.id IS NOT NULL THEN
            IF cardinality(step_kinds) > 0 THEN
                PERFORM reserve_children(made.id, p_organization_id, step_kinds);
            END IF;
            -- Who started it, for the organization's audit log: the scoped user (an operator's
            -- retry scopes the operator), else the requester.
            INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                                   request_id)
            VALUES (p_organization_id, coalesce(app_user(), p_requested_by),
                    coalesce(app_actor(), 'user:' || p_requested_by), 'job.submit', made.id,
                    jsonb_strip_nulls(jsonb_build_object('kind', p_kind, 'retry_of', made.retry_of)),
                    p_request_id);
            RETURN QUERY SELECT 'created', standing.role, standing.state, made.id,
                made.organization_id, made.requested_by, made.kind, made.status, made.attempts,
                made.max_attempts, made.progress, made.error_code, made.error_message,
                made.dedup_key, made.run_after, made.created_at, made.updated_at,
                made.started_at, made.finished_at, made.cancel_requested_at, made.leased_by,
                made.lease_until, made.result_expired_at, made.params, NULL, NULL::integer,
                made.sequence_key;
            RETURN;
        END IF;

        -- A conflict: the same Idempotency-Key committed meanwhile, or an active duplicate.
        IF p_idempotency_key IS NOT NULL THEN
            SELECT * INTO made FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
              AND j.idempotency_key = p_idempotency_key;
        END IF;
    END IF;
    IF made.id IS NULL THEN
        SELECT * INTO made FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.kind = p_kind
          AND j.dedup_key = p_dedup_key AND j.status IN ('queued', 'leased', 'cancel_requested')
          AND (j.debounce_seconds IS NULL) = (p_debounce_seconds IS NULL);
        -- The conflicting job may have ended in between: then there is nothing to name, and
        -- the caller may simply submit again.
    END IF;
    RETURN QUERY SELECT CASE WHEN p_idempotency_key IS NOT NULL AND made.idempotency_key
                                  IS NOT DISTINCT FROM p_idempotency_key
                             THEN 'replayed' ELSE 'duplicate' END,
        standing.role, standing.state, made.id,
        made.organization_id, made.requested_by, made.kind, made.status, made.attempts,
        made.max_attempts, made.progress, made.error_code, made.error_message,
        made.dedup_key, made.run_after, made.created_at, made.updated_at, made.started_at,
        made.finished_at, made.cancel_requested_at, made.leased_by, made.lease_until,
        made.result_expired_at, made.params, NULL, NULL::integer, made.sequence_key;
END $$;
REVOKE ALL ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                  text, text, timestamptz, uuid, integer, integer, integer, text, text,
                                  integer, text[], integer[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                     text, text, timestamptz, uuid, integer, integer, integer, text, text,
                                     integer, text[], integer[])
    TO space_app, space_worker;

DROP FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[], integer[],
                          integer[], text[], timestamptz[], integer, integer[], integer[], text,
                          text[]);
-- The bulk submit: many jobs of the organization in one statement, ids made by the caller so
-- the answer keeps the request's order. The standing is checked once against the strictest
-- rules of the batch's kinds (every state they all allow, the highest role any needs): the
-- caller tells which item a refusal concerns. The whole batch is admitted against the caps or
-- none of it. A row that meets an active duplicate is skipped and missing from the answer; the
-- caller then rolls the batch back: all or nothing.
-- Called by name too (store.sql), without defaults but the last: its one caller passes every
-- argument, and defaults would need the optional p_request_id moved behind the required
-- arrays, a new signature for no caller's gain. p_traceparent (revision 0034) is the batch's
-- one trace context, optional so that the previous release's web still calls it; so are
-- p_sequence_keys (revision 0037), each job's own, taking places in the batch's order.
CREATE FUNCTION submit_jobs(
    p_organization_id uuid, p_requested_by uuid, p_org_states text[], p_role text,
    p_request_id text, p_ids uuid[], p_kinds text[], p_params jsonb[], p_max_attempts integer[],
    p_lease_seconds integer[], p_dedup_keys text[], p_run_afters timestamptz[],
    p_org_quota integer, p_kind_quotas integer[], p_priorities integer[],
    p_traceparent text DEFAULT NULL, p_sequence_keys text[] DEFAULT NULL,
    p_quota_kinds text[] DEFAULT NULL, p_quota_caps integer[] DEFAULT NULL)
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb,
    quota_kind text, quota_limit integer, sequence_key text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    standing record;
    refusal record;
    sequence_lock integer;
    -- the steps of the batch's workflows, admitted with them (as in submit_job())
    step_kinds text[];
BEGIN
    SELECT m.role, o.state INTO standing
    FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = p_organization_id AND m.user_id = p_requested_by
    FOR SHARE OF m, o;
    IF NOT FOUND OR standing.state <> ALL (p_org_states)
       OR role_rank(standing.role) < role_rank(p_role) THEN
        RETURN QUERY SELECT 'refused', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, NULL, NULL::integer, NULL;
        RETURN;
    END IF;
    step_kinds := ARRAY(SELECT unnest(workflow_step_kinds(u.kind, u.params))
                        FROM unnest(p_kinds, p_params) AS u (kind, params));
    -- The organization's cap is the database's (p_org_quota is ignored, as in submit_job()).
    SELECT * INTO refusal
    FROM admit_jobs(p_organization_id, p_kinds || step_kinds,
                    p_kind_quotas || ARRAY(
                        SELECT c.cap FROM unnest(step_kinds) WITH ORDINALITY AS k (kind, n)
                        LEFT JOIN unnest(p_quota_kinds, p_quota_caps) AS c (kind, cap)
                               ON c.kind = k.kind
                        ORDER BY k.n),
                    (SELECT q.active_jobs FROM quota_policy q), false);
    IF FOUND THEN
        RETURN QUERY SELECT 'over_quota', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, refusal.refused_kind, refusal.cap, NULL;
        RETURN;
    END IF;
    -- The batch's sequences, one lock each in one order (see submit_job()).
    FOR sequence_lock IN
        SELECT DISTINCT hashtext('spacejobs.sequence:' || p_organization_id::text || ':' || k.key)
        FROM unnest(p_sequence_keys) AS k (key) WHERE k.key IS NOT NULL ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(sequence_lock);
    END LOOP;
    RETURN QUERY
    WITH made AS (
        INSERT INTO jobs AS j (id, organization_id, requested_by, kind, params, max_attempts,
                               lease_seconds, dedup_key, request_id, run_after, priority,
                               traceparent, sequence_key, sequence_position)
        SELECT n.id, p_organization_id, p_requested_by, n.kind, n.params,
               least(greatest(n.max_attempts, 1), 100), least(greatest(n.lease_seconds, 1), 86400),
               n.dedup_key, p_request_id, coalesce(n.run_after, now()), coalesce(n.priority, 0),
               p_traceparent, n.sequence_key,
               -- taken row by row in the batch's order (the subquery's), so places follow it
               CASE WHEN n.sequence_key IS NOT NULL THEN nextval('job_sequence_positions') END
        FROM (SELECT u.* FROM unnest(p_ids, p_kinds, p_params, p_max_attempts, p_lease_seconds,
                                     p_dedup_keys, p_run_afters, p_priorities,
                                     coalesce(p_sequence_keys,
                                              array_fill(NULL::text,
                                                         ARRAY[cardinality(p_ids)])))
                  WITH ORDINALITY AS u (id, kind, params, max_attempts, lease_seconds,
                                        dedup_key, run_after, priority, sequence_key, ord)
              ORDER BY u.ord) AS n
        ON CONFLICT DO NOTHING
        RETURNING j.*
    ), audited AS (
        -- Who started each, for the organization's audit log (as in submit_job()).
        INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                               request_id)
        SELECT p_organization_id, coalesce(app_user(), p_requested_by),
               coalesce(app_actor(), 'user:' || p_requested_by), 'job.submit', made.id,
               jsonb_build_object('kind', made.kind, 'bulk', true), p_request_id
        FROM made
    ), reserved AS (
        -- The steps of each workflow made, counted as active from now on (reserve_children()).
        INSERT INTO job_reservations AS r (parent_id, organization_id, kind, reserved)
        SELECT made.id, p_organization_id, s.kind, count(*)
        FROM made, unnest(workflow_step_kinds(made.kind, made.params)) AS s (kind)
        GROUP BY made.id, s.kind
        ON CONFLICT ON CONSTRAINT job_reservations_pkey
        DO UPDATE SET reserved = r.reserved + excluded.reserved
    )
    SELECT 'created', standing.role, standing.state, made.id, made.organization_id,
        made.requested_by, made.kind, made.status, made.attempts, made.max_attempts,
        made.progress, made.error_code, made.error_message, made.dedup_key, made.run_after,
        made.created_at, made.updated_at, made.started_at, made.finished_at,
        made.cancel_requested_at, made.leased_by, made.lease_until, made.result_expired_at,
        made.params, NULL, NULL::integer, made.sequence_key
    FROM made;
END $$;
REVOKE ALL ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                   integer[], integer[], text[], timestamptz[], integer, integer[],
                                   integer[], text, text[], text[], integer[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                      integer[], integer[], text[], timestamptz[], integer,
                                      integer[], integer[], text, text[], text[], integer[])
    TO space_app, space_worker;

-- The next children of these fan-outs, as many as each has room for (max_parallel minus the
-- released ones not ended), in place order, for the parent's organization and requester (from
-- the parent's row). Nothing is released under a parent that is stopping (cancel_requested)
-- or has ended. Each child made takes the place its parent reserved for it (start_fan_out()),
-- so the organization's count of active jobs does not move. The callers hold the parents' rows
-- locked. Returns how many were made.
CREATE OR REPLACE FUNCTION release_children(p_parents uuid[]) RETURNS integer
LANGUAGE plpgsql SET search_path = public, pg_temp
-- Index probes by parent and place: the jobs trigger that calls it turns nested loops off for
-- its transition tables, which would make these hash joins over every job.
SET enable_nestloop = on AS $$
DECLARE
    made integer;
BEGIN
    WITH due AS (
        SELECT f.parent_id, f.released AS first,
               least(f.max_parallel - (f.released - f.ended), f.total - f.released) AS take
        FROM job_fan_outs f JOIN jobs p ON p.id = f.parent_id
        WHERE f.parent_id = ANY (p_parents) AND p.status IN ('queued', 'leased', 'waiting')
          AND f.released < f.total AND f.released - f.ended < f.max_parallel
    ), taken AS (
        DELETE FROM job_fan_out_items i USING due d
        WHERE i.parent_id = d.parent_id AND i.place >= d.first AND i.place < d.first + d.take
        RETURNING i.parent_id, i.place, i.params
    ), counted AS (
        UPDATE job_fan_outs f SET released = f.released + d.take
        FROM due d WHERE f.parent_id = d.parent_id
    ), inserted AS (
        INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                          request_id, parent_id, child_index)
        SELECT p.organization_id, p.requested_by, f.kind, t.params, f.max_attempts, f.lease_seconds,
               p.request_id, p.id, t.place
        FROM taken t JOIN job_fan_outs f ON f.parent_id = t.parent_id JOIN jobs p ON p.id = t.parent_id
        ORDER BY t.parent_id, t.place
        ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING
        RETURNING jobs.parent_id, jobs.kind
    ), moved AS (
        UPDATE job_reservations r SET reserved = r.reserved - least(r.reserved, i.n)
        FROM (SELECT c.parent_id, c.kind, count(*)::integer AS n FROM inserted c
              GROUP BY c.parent_id, c.kind) AS i
        WHERE r.parent_id = i.parent_id AND r.kind = i.kind
    )
    SELECT count(*) INTO made FROM inserted;
    RETURN made;
END $$;
REVOKE ALL ON FUNCTION release_children(uuid[]) FROM PUBLIC;

DROP FUNCTION start_fan_out(uuid, uuid, text, jsonb[], integer, integer, integer);
-- The parent's fan-out, for the worker holding its lease: its items (place = position in
-- p_params) and the first children released, in one transaction. The children are admitted
-- against the quotas first, all of them (the organization's cap is the database's; p_kind_quota
-- is the kind's declared one), and counted as active from then on: over a cap, nothing is
-- recorded and refused_kind and cap say which (the caller's attempt fails, to be retried). A
-- fan-out already started (by an earlier attempt of the parent) is left as it is. Children the
-- parent made before, one by one (workers did so before revision 0033: always the first
-- places), count as released. Returns the fan-out, or no row when the lease is no longer the
-- caller's or a cancel was asked for.
CREATE FUNCTION start_fan_out(p_parent uuid, p_token uuid, p_kind text, p_params jsonb[],
                              p_max_parallel integer, p_max_attempts integer,
                              p_lease_seconds integer, p_kind_quota integer DEFAULT NULL)
RETURNS TABLE (total integer, released integer, ended integer, refused_kind text, cap integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    parent jobs;
    made integer;
    finished integer;
    refusal record;
BEGIN
    -- Locked like a child's end locks it: the counts below and the trigger's never cross.
    SELECT * INTO parent FROM jobs j
    WHERE j.id = p_parent AND j.lease_token = p_token AND j.status = 'leased' FOR UPDATE;
    IF parent.id IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM job_fan_outs f WHERE f.parent_id = p_parent) THEN
        SELECT count(*), count(*) FILTER (WHERE c.status IN ('completed', 'failed', 'cancelled'))
        INTO made, finished
        FROM jobs c WHERE c.parent_id = p_parent;
        made := least(made, coalesce(cardinality(p_params), 0));
        IF coalesce(cardinality(p_params), 0) > made THEN
            SELECT * INTO refusal
            FROM admit_jobs(parent.organization_id,
                            array_fill(p_kind, ARRAY[cardinality(p_params) - made]),
                            array_fill(p_kind_quota, ARRAY[cardinality(p_params) - made]),
                            (SELECT q.active_jobs FROM quota_policy q), false);
            IF FOUND THEN
                RETURN QUERY SELECT NULL::integer, NULL::integer, NULL::integer,
                                    refusal.refused_kind, refusal.cap;
                RETURN;
            END IF;
            PERFORM reserve_children(p_parent, parent.organization_id,
                                     array_fill(p_kind, ARRAY[cardinality(p_params) - made]));
        END IF;
        INSERT INTO job_fan_outs (parent_id, kind, max_attempts, lease_seconds, max_parallel,
                                  total, released, ended)
        VALUES (p_parent, p_kind, least(greatest(p_max_attempts, 1), 100),
                least(greatest(p_lease_seconds, 1), 86400), greatest(p_max_parallel, 1),
                coalesce(cardinality(p_params), 0), made, least(finished, made));
        INSERT INTO job_fan_out_items (parent_id, place, params)
        SELECT p_parent, c.place - 1, c.params
        FROM unnest(p_params) WITH ORDINALITY AS c (params, place)
        WHERE c.place > made;
        PERFORM release_children(ARRAY[p_parent]);
    END IF;
    RETURN QUERY SELECT f.total, f.released, f.ended, NULL::text, NULL::integer
    FROM job_fan_outs f WHERE f.parent_id = p_parent;
END $$;
REVOKE ALL ON FUNCTION start_fan_out(uuid, uuid, text, jsonb[], integer, integer, integer, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_fan_out(uuid, uuid, text, jsonb[], integer, integer, integer,
                                        integer)
    TO space_worker;

-- The steps of these workflows whose dependencies have all completed, made now, under a
-- parent that is not stopping, and not after a failure under fail_fast, in place order and no
-- more than max_parallel unfinished. Only steps that wait for one of p_completed (places that
-- just completed) are looked at, or all when it is NULL or the workflow has a max_parallel
-- (a step ready before may have waited for room). Each step made takes the place its workflow
-- reserved for it (submit_job(), start_workflow()). The callers hold the parents' rows locked.
-- Returns how many were made.
CREATE OR REPLACE FUNCTION release_steps(p_parents uuid[], p_completed integer[]) RETURNS integer
LANGUAGE plpgsql SET search_path = public, pg_temp
-- As release_children(): index probes, whatever the calling trigger turned off.
SET enable_nestloop = on AS $$
DECLARE
    made integer;
BEGIN
    WITH candidates AS (
        SELECT s.parent_id, s.place, w.max_parallel - (w.released - w.ended) AS room,
               row_number() OVER (PARTITION BY s.parent_id ORDER BY s.place) AS nth
        FROM job_workflow_steps s
        JOIN job_workflows w ON w.parent_id = s.parent_id
        JOIN jobs p ON p.id = s.parent_id
        WHERE s.parent_id = ANY (p_parents) AND p.status IN ('queued', 'leased', 'waiting')
          AND (p_completed IS NULL OR w.max_parallel IS NOT NULL OR s.after && p_completed)
          AND NOT (w.policy = 'fail_fast' AND w.failed > 0)
          AND NOT EXISTS (
                SELECT 1 FROM unnest(s.after) AS d (place)
                LEFT JOIN jobs c ON c.parent_id = s.parent_id AND c.child_index = d.place
                WHERE c.status IS DISTINCT FROM 'completed')
    ), ready AS (
        SELECT c.parent_id, c.place FROM candidates c WHERE c.room IS NULL OR c.nth <= c.room
    ), taken AS (
        DELETE FROM job_workflow_steps s USING ready r
        WHERE s.parent_id = r.parent_id AND s.place = r.place
        RETURNING s.parent_id, s.place, s.kind, s.params, s.after, s.max_attempts, s.lease_seconds
    ), counted AS (
        UPDATE job_workflows w SET released = w.released + t.n
        FROM (SELECT parent_id, count(*)::integer AS n FROM taken GROUP BY parent_id) AS t
        WHERE w.parent_id = t.parent_id
    ), inserted AS (
        INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                          request_id, parent_id, child_index)
        SELECT p.organization_id, p.requested_by, t.kind,
               t.params || jsonb_build_object('_inputs', (
                   SELECT coalesce(jsonb_agg(c.result ORDER BY d.ord), '[]'::jsonb)
                   FROM unnest(t.after) WITH ORDINALITY AS d (place, ord)
                   JOIN jobs c ON c.parent_id = t.parent_id AND c.child_index = d.place)),
               t.max_attempts, t.lease_seconds, p.request_id, p.id, t.place
        FROM taken t JOIN jobs p ON p.id = t.parent_id
        ORDER BY t.parent_id, t.place
        ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING
        RETURNING jobs.parent_id, jobs.kind
    ), moved AS (
        UPDATE job_reservations r SET reserved = r.reserved - least(r.reserved, i.n)
        FROM (SELECT c.parent_id, c.kind, count(*)::integer AS n FROM inserted c
              GROUP BY c.parent_id, c.kind) AS i
        WHERE r.parent_id = i.parent_id AND r.kind = i.kind
    )
    SELECT count(*) INTO made FROM inserted;
    RETURN made;
END $$;
REVOKE ALL ON FUNCTION release_steps(uuid[], integer[]) FROM PUBLIC;

DROP FUNCTION start_workflow(uuid, uuid, text, integer, text[], jsonb[], jsonb[], integer[],
                             integer[]);
-- The parent's workflow, for the worker holding its lease: its steps (place = position in the
-- arrays; p_after: each step's places as a JSON array), at most p_max_parallel unfinished at a
-- time (NULL: no bound), and the steps ready at once, in one transaction. Every step counts as
-- an active job from then on: the steps beyond those its submit already reserved (a kind's own
-- ctx.workflow reserved none) are admitted against the quotas first (the organization's cap is
-- the database's; p_quotas are the steps' kinds' declared ones); over a cap nothing is
-- recorded, and refused_kind and cap say which. A workflow already started is left as it is;
-- steps the parent made before, one by one (before revision 0033), count as released. Returns
-- the workflow, or no row when the lease is no longer the caller's or a cancel was asked for.
CREATE FUNCTION start_workflow(p_parent uuid, p_token uuid, p_policy text, p_max_parallel integer,
                               p_kinds text[], p_params jsonb[], p_after jsonb[],
                               p_max_attempts integer[], p_lease_seconds integer[],
                               p_quotas integer[] DEFAULT NULL)
RETURNS TABLE (total integer, released integer, ended integer, failed integer,
               refused_kind text, cap integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    parent jobs;
    unreserved text[];
    unreserved_caps integer[];
    refusal record;
BEGIN
    SELECT * INTO parent FROM jobs j
    WHERE j.id = p_parent AND j.lease_token = p_token AND j.status = 'leased' FOR UPDATE;
    IF parent.id IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM job_workflows w WHERE w.parent_id = p_parent) THEN
        -- The steps not made yet, one entry each, less those already reserved per kind.
        SELECT coalesce(array_agg(n.kind), '{}'), coalesce(array_agg(n.cap), '{}')
        INTO unreserved, unreserved_caps
        FROM (SELECT s.kind, s.cap,
                     row_number() OVER (PARTITION BY s.kind ORDER BY s.place) AS nth
              FROM unnest(p_kinds, coalesce(p_quotas, array_fill(NULL::integer,
                                                                 ARRAY[cardinality(p_kinds)])))
                       WITH ORDINALITY AS s (kind, cap, place)
              WHERE NOT EXISTS (SELECT 1 FROM jobs c
                                WHERE c.parent_id = p_parent AND c.child_index = s.place - 1)
             ) AS n
        LEFT JOIN job_reservations r ON r.parent_id = p_parent AND r.kind = n.kind
        WHERE n.nth > coalesce(r.reserved, 0);
        IF cardinality(unreserved) > 0 THEN
            SELECT * INTO refusal
            FROM admit_jobs(parent.organization_id, unreserved, unreserved_caps,
                            (SELECT q.active_jobs FROM quota_policy q), false);
            IF FOUND THEN
                RETURN QUERY SELECT NULL::integer, NULL::integer, NULL::integer, NULL::integer,
                                    refusal.refused_kind, refusal.cap;
                RETURN;
            END IF;
            PERFORM reserve_children(p_parent, parent.organization_id, unreserved);
        END IF;
        INSERT INTO job_workflows (parent_id, policy, max_parallel, total, released, ended, failed)
        SELECT p_parent, p_policy,
               CASE WHEN p_max_parallel IS NOT NULL THEN greatest(p_max_parallel, 1) END,
               coalesce(cardinality(p_kinds), 0),
               count(*),
               count(*) FILTER (WHERE c.status IN ('completed', 'failed', 'cancelled')),
               count(*) FILTER (WHERE c.status IN ('failed', 'cancelled'))
        FROM jobs c WHERE c.parent_id = p_parent;
        INSERT INTO job_workflow_steps (parent_id, place, kind, params, after, max_attempts,
                                        lease_seconds)
        SELECT p_parent, s.place - 1, s.kind, s.params,
               ARRAY(SELECT jsonb_array_elements_text(s.after)::integer),
               least(greatest(s.max_attempts, 1), 100), least(greatest(s.lease_seconds, 1), 86400)
        FROM unnest(p_kinds, p_params, p_after, p_max_attempts, p_lease_seconds)
                 WITH ORDINALITY AS s (kind, params, after, max_attempts, lease_seconds, place)
        WHERE NOT EXISTS (SELECT 1 FROM jobs c
                          WHERE c.parent_id = p_parent AND c.child_index = s.place - 1);
        PERFORM release_steps(ARRAY[p_parent], NULL);
    END IF;
    RETURN QUERY SELECT w.total, w.released, w.ended, w.failed, NULL::text, NULL::integer
    FROM job_workflows w WHERE w.parent_id = p_parent;
END $$;
REVOKE ALL ON FUNCTION start_workflow(uuid, uuid, text, integer, text[], jsonb[], jsonb[],
                                      integer[], integer[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_workflow(uuid, uuid, text, integer, text[], jsonb[], jsonb[],
                                         integer[], integer[], integer[]) TO space_worker;

