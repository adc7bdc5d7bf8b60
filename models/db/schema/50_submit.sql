-- Submits: one statement checks the requester's standing, admits the jobs against the quotas
-- and writes them.

-- SECURITY DEFINER: these functions write as the owner whatever the caller's scope, so they
-- check the membership themselves (held FOR SHARE until commit). The rules they apply come from
-- the caller's code (the kind's allowed organization states and least role), as the requester
-- comes from the authenticated context. A job is only ever born the way they make it: queued,
-- attempt 0, no lease, no result, bounded attempts and lease.

-- Quotas: how many active jobs an organization, or a kind of it, may have.

-- How many active jobs the organization (p_kind NULL) or one kind of it has, as committed when
-- the calling statement began: the sum of its rows in active_job_counts, a few rows whatever
-- the number of jobs. PL/pgSQL rather than SQL, because it keeps the statement's plan for the
-- session: every submit calls it.
CREATE FUNCTION active_jobs(p_organization_id uuid, p_kind text)
RETURNS bigint LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (SELECT coalesce(sum(c.active), 0) FROM active_job_counts c
            WHERE c.organization_id = p_organization_id AND (p_kind IS NULL OR c.kind = p_kind));
END $$;
REVOKE ALL ON FUNCTION active_jobs(uuid, text) FROM PUBLIC;

-- The cap that refuses p_kinds (one entry per job about to be written) when `margin` more jobs
-- than these may still appear unseen: ('', cap) for the organization's, (kind, cap) for a
-- kind's, no row when every cap leaves room. p_kind_caps are the kinds' declared quotas
-- (NULL: none), p_org_cap the default; the operators' rows in job_quotas win over both.
CREATE FUNCTION quota_refusal(p_organization_id uuid, p_kinds text[], p_kind_caps integer[],
                              p_org_cap integer, margin integer)
RETURNS TABLE (refused_kind text, cap integer)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    wanted record;
BEGIN
    FOR wanted IN
        -- the organization first, then each kind of the batch once
        SELECT '' AS kind, cardinality(p_kinds) AS n,
               coalesce((SELECT q.max_active FROM job_quotas q
                         WHERE q.organization_id = p_organization_id AND q.kind = ''),
                        p_org_cap) AS cap, 0 AS ord
        UNION ALL
        SELECT k.kind, count(*)::integer,
               coalesce(max(q.max_active), max(k.cap)), 1
        FROM unnest(p_kinds, p_kind_caps) AS k (kind, cap)
        LEFT JOIN job_quotas q ON q.organization_id = p_organization_id AND q.kind = k.kind
        GROUP BY k.kind
        ORDER BY ord, kind
    LOOP
        CONTINUE WHEN wanted.cap IS NULL;
        IF active_jobs(p_organization_id, nullif(wanted.kind, '')) + wanted.n + margin
           > wanted.cap THEN
            RETURN QUERY SELECT wanted.kind, wanted.cap;
            RETURN;
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION quota_refusal(uuid, text[], integer[], integer, integer) FROM PUBLIC;

-- May these jobs (p_kinds: one entry per job) be written? NULL when yes; else the cap that
-- refuses ('' for the organization's, or the kind's name) and its value. Exact: no interleaving
-- of concurrent submits, from any number of web processes, commits more active jobs than a cap.
--
-- Why not one lock per organization held until commit: it would make every submit of the
-- organization wait for the previous one's commit (its WAL flush), so one organization could
-- never submit faster than commits flush one by one. Instead the organization has STRIPES
-- advisory locks ("stripes"), each held until commit:
--
--   fast path, for a single job submitted by a transaction that had written nothing before
--   (p_first_write: it had no transaction id when the submit began): take ONE stripe (any free
--   one, else wait for one), then count; admitted when count + STRIPES <= cap. Submits on
--   different stripes run side by side.
--   slow path, for everything else (batches, a transaction's second write, or a count near
--   the cap): take ALL stripes in order (waiting for each fast submit in flight to commit or
--   roll back), then count; admitted when count + n <= cap.
--
-- Every count is a statement begun AFTER its locks (READ COMMITTED: each statement takes a new
-- snapshot), and a fast path that finds itself near the cap gives its stripe back by rolling
-- back the subtransaction that took it, so a waiting transaction never holds a stripe it took
-- for nothing.
--
-- Proof that no commit takes a cap past its value. Let A(t) be the organization's active jobs
-- committed at time t; a job only ever leaves the active set, so A grows only by commits of
-- submits. Take any moment τ and, among all admissions of transactions committed by τ, the
-- one whose count has the LATEST snapshot t_X; call its transaction X. A job active at τ was
-- either committed before t_X (then counted in A(t_X)) or written by a transaction Y committed
-- after t_X, all of whose admissions counted at or before t_X: Y was in flight at t_X, holding
-- the stripe(s) it took before its count(s), until its commit.
--   - X's admission was slow: X held every stripe at t_X, so no such Y other than X exists.
--     A(τ) <= (what X counted: A(t_X) plus X's own earlier jobs) + n_X <= cap.
--   - X's admission was fast: X held one stripe at t_X and had written nothing before, so
--     this is X's only job. A Y with a slow admission would have held every stripe at t_X,
--     X's included: impossible. So every Y made exactly one fast admission (a fast admission
--     is a transaction's first write, and any later one is slow, hence also at or before t_X:
--     impossible as just shown) of one job, holding its own stripe at t_X: at most STRIPES - 1
--     of them. A(τ) <= A(t_X) + 1 + (STRIPES - 1) <= cap, since X was admitted with
--     A(t_X) + STRIPES <= cap.
-- The same argument holds for each kind's count. It needs READ COMMITTED (checked below):
-- under REPEATABLE READ a count would see the transaction's first snapshot, taken before its
-- locks. Jobs the owner writes directly (a restore, test fixtures) are outside it.
--
-- A transaction that submits twice holds its first stripe while its second (slow) submit
-- waits for the others; should a fast submit meanwhile wait for it (inserting the same
-- dedup_key or Idempotency-Key), PostgreSQL's deadlock detector rolls one of them back whole:
-- nothing is written and it may be retried. The web never submits twice in one transaction.
CREATE FUNCTION admit_jobs(p_organization_id uuid, p_kinds text[], p_kind_caps integer[],
                           p_org_cap integer, p_first_write boolean)
RETURNS TABLE (refused_kind text, cap integer)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    stripes CONSTANT integer := 16;
    lock_key CONSTANT integer := hashtext('spacejobs.quota:' || p_organization_id::text);
    first_stripe integer;
    got boolean;
BEGIN
    IF p_org_cap IS NULL AND NOT EXISTS (SELECT 1 FROM unnest(p_kind_caps) c WHERE c IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM job_quotas q WHERE q.organization_id = p_organization_id) THEN
        RETURN;  -- no cap applies: nothing to count
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'submitting jobs needs READ COMMITTED isolation (the quota counts what '
                        'committed before its locks)' USING ERRCODE = 'feature_not_supported';
    END IF;

    IF cardinality(p_kinds) = 1 AND p_first_write THEN
        BEGIN
            -- any free stripe; when all are taken, wait for a random one (holding no other)
            first_stripe := floor(random() * stripes)::integer;
            got := false;
            FOR i IN 0 .. stripes - 1 LOOP
                got := pg_try_advisory_xact_lock(lock_key, (first_stripe + i) % stripes);
                EXIT WHEN got;
            END LOOP;
            IF NOT got THEN
                PERFORM pg_advisory_xact_lock(lock_key, first_stripe);
            END IF;
            IF NOT EXISTS (SELECT 1 FROM quota_refusal(p_organization_id, p_kinds, p_kind_caps,
                                                       p_org_cap, stripes - 1)) THEN
                RETURN;  -- admitted; the subtransaction commits and the stripe is kept
            END IF;
            -- near a cap: roll the subtransaction back, which gives the stripe back
            RAISE EXCEPTION USING ERRCODE = 'SJQ01';
        EXCEPTION WHEN SQLSTATE 'SJQ01' THEN
            NULL;
        END;
    END IF;

    FOR i IN 0 .. stripes - 1 LOOP
        PERFORM pg_advisory_xact_lock(lock_key, i);
    END LOOP;
    RETURN QUERY SELECT r.refused_kind, r.cap
                 FROM quota_refusal(p_organization_id, p_kinds, p_kind_caps, p_org_cap, 0) AS r;
END $$;
REVOKE ALL ON FUNCTION admit_jobs(uuid, text[], integer[], integer, boolean) FROM PUBLIC;

CREATE FUNCTION role_rank(role text) RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT array_position(ARRAY['member', 'admin', 'owner'], role)
$$;

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
