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
-- session: every submit calls it. By the table's key, however small the table looks: a
-- sequential scan reads every version of every organization's counts that a long-open
-- transaction keeps (every submit and finish writes one).
CREATE FUNCTION active_jobs(p_organization_id uuid, p_kind text)
RETURNS bigint LANGUAGE plpgsql STABLE SET search_path = public, pg_temp
SET enable_seqscan = off AS $$
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
-- reserved is exactly what the workflow's run will make. PL/pgSQL, not SQL: a SQL function
-- whose body holds a subquery is not inlined, and was planned again at every call (every
-- submit), where PL/pgSQL keeps its plan for the session and a plain job never reaches it.
CREATE FUNCTION workflow_step_kinds(p_kind text, p_params jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_kind = 'workflow' AND jsonb_typeof(p_params -> 'steps') = 'array' THEN
        RETURN ARRAY(SELECT s.step ->> 'kind'
                     FROM jsonb_array_elements(p_params -> 'steps') AS s (step));
    END IF;
    RETURN '{}'::text[];
END $$;

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

-- Every submit, one job or many: the standing checked (and held until commit), the batch
-- admitted against the caps, each job written with its audit entry, or the answer for each
-- job that is not (a debounce, a replay, a duplicate), in ONE statement. A single submit is a
-- batch of one, so the web's one job, a bulk request and a script's enqueue write the same
-- rows, events and audit entries by the same code.
--
-- Called by name (models/jobs/store.sql), so no caller depends on the order of its arguments;
-- the optional ones default to NULL ("none"). Not one jsonb or composite argument: each value
-- keeps its PostgreSQL type, checked at the call before the body runs. The names are
-- revision 0041's submit_jobs() and more, so the previous release's web still calls it during
-- a rolling deploy (p_org_quota is ignored, as it was: the organization's cap is the
-- database's, quota_policy and job_quotas; a kind's declared cap is the caller's, as its other
-- rules are: p_kind_quotas for the jobs', p_quota_caps for the kinds of their steps).
--
-- The standing is checked once against the strictest rules of the batch's kinds (every state
-- they all allow, the highest role any needs): the caller tells which job a refusal concerns.
-- The whole batch is admitted or none of it; a batch of one written by the transaction's first
-- statement takes admit_jobs()' fast path. Ids are made by the caller, so that each answer
-- names its place (1-based) in the request.
--
-- outcome, one row per job by place: 'created'; 'debounced' (p_debounce_seconds with a
-- dedup key: a queued, never started job of that key took these params and starts that many
-- seconds from now; it is answered); 'replayed' (p_idempotency_key, for a batch of one: the
-- job a submit with that key made before, whatever the quota); 'duplicate' (an active job has
-- the dedup key: its id is answered, NULL if it ended meanwhile; nothing was written for this
-- place, and a caller of a batch rolls the others back). Or ONE row and nothing written:
-- 'over_quota' (quota_kind and quota_limit say which cap) or 'refused' (the requester's role
-- and the organization's state are answered, NULL for a non-member, so the caller can say why
-- in its own words). p_bulk: the audit entries say the jobs came in a bulk request.
CREATE FUNCTION submit_jobs(
    p_organization_id uuid, p_requested_by uuid, p_org_states text[], p_role text,
    p_request_id text, p_ids uuid[], p_kinds text[], p_params jsonb[], p_max_attempts integer[],
    p_lease_seconds integer[], p_dedup_keys text[], p_run_afters timestamptz[],
    p_org_quota integer, p_kind_quotas integer[], p_priorities integer[],
    p_traceparent text DEFAULT NULL, p_sequence_keys text[] DEFAULT NULL,
    p_quota_kinds text[] DEFAULT NULL, p_quota_caps integer[] DEFAULT NULL,
    p_debounce_seconds integer[] DEFAULT NULL, p_idempotency_key text DEFAULT NULL,
    p_retry_of uuid DEFAULT NULL, p_bulk boolean DEFAULT true)
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb,
    quota_kind text, quota_limit integer, sequence_key text, request_place integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    -- before the FOR SHARE below, which takes a transaction id without writing a job
    first_write CONSTANT boolean := pg_current_xact_id_if_assigned() IS NULL;
    wanted CONSTANT integer := cardinality(p_ids);
    standing record;
    refusal record;
    sequence_lock integer;
    -- places answered before the insert (debounced): not written, not admitted
    answered integer[] := '{}';
    -- the steps of the batch's workflows, admitted with them and counted as active from now on
    step_kinds text[];
    kinds_left text[];
    caps_left integer[];
    created integer;
    found_job jobs;
    replaced_requester uuid;
    missing integer;
BEGIN
    IF p_idempotency_key IS NOT NULL AND wanted <> 1 THEN
        RAISE EXCEPTION 'an Idempotency-Key names one job' USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
            NULL::jsonb, NULL, NULL::integer, NULL, NULL::integer;
        RETURN;
    END IF;

    -- One submit of a sequence at a time, each taking its places after the last one's commit:
    -- were two in flight, the later place could commit first, run, and then the earlier one
    -- start beside it (the claim sees only what has committed). One lock per key, in one order.
    IF p_sequence_keys IS NOT NULL THEN
        FOR sequence_lock IN
            SELECT DISTINCT hashtext('spacejobs.sequence:' || p_organization_id::text || ':'
                                     || k.key)
            FROM unnest(p_sequence_keys) AS k (key) WHERE k.key IS NOT NULL ORDER BY 1
        LOOP
            PERFORM pg_advisory_xact_lock(sequence_lock);
        END LOOP;
    END IF;

    -- A debounce: the queued, never started job with the key takes the new params and moves
    -- its start. Debounces of one key take turns (the lock, until commit), so each sees the job
    -- the one before made; a claim that leases the job first (its row lock, then a status this
    -- no longer matches) leaves nothing to update, and a new job is made. Never a workflow:
    -- its steps were admitted and reserved with it, and new params would bring other steps.
    IF p_debounce_seconds IS NOT NULL THEN
        FOR i IN 1 .. wanted LOOP
            CONTINUE WHEN p_debounce_seconds[i] IS NULL OR p_dedup_keys[i] IS NULL
                OR cardinality(workflow_step_kinds(p_kinds[i], p_params[i])) > 0;
            PERFORM pg_advisory_xact_lock(hashtext('spacejobs.debounce:'
                                                   || p_organization_id::text || ':'
                                                   || p_kinds[i] || ':' || p_dedup_keys[i]));
            found_job := NULL;
            SELECT j.id, j.requested_by INTO found_job.id, replaced_requester FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.kind = p_kinds[i]
              AND j.dedup_key = p_dedup_keys[i] AND j.debounce_seconds IS NOT NULL
              AND j.status = 'queued' AND j.attempts = 0
            FOR UPDATE;
            CONTINUE WHEN found_job.id IS NULL;
            UPDATE jobs j
            SET params = p_params[i], requested_by = p_requested_by,
                run_after = now() + p_debounce_seconds[i] * interval '1 second',
                debounce_seconds = p_debounce_seconds[i], request_id = p_request_id
            WHERE j.id = found_job.id
            RETURNING * INTO found_job;
            -- Both requesters: the actor, and as the entry's member the one whose job it was,
            -- when that was someone else (their job now runs for the actor).
            INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, member_id,
                                   detail, request_id)
            VALUES (p_organization_id, coalesce(app_user(), p_requested_by),
                    coalesce(app_actor(), 'user:' || p_requested_by), 'job.debounce',
                    found_job.id, nullif(replaced_requester, p_requested_by),
                    jsonb_build_object('kind', p_kinds[i]), p_request_id);
            RETURN QUERY SELECT 'debounced', standing.role, standing.state, j.id,
                j.organization_id, j.requested_by, j.kind, j.status, j.attempts, j.max_attempts,
                j.progress, j.error_code, j.error_message, j.dedup_key, j.run_after,
                j.created_at, j.updated_at, j.started_at, j.finished_at, j.cancel_requested_at,
                j.leased_by, j.lease_until, j.result_expired_at, j.params, NULL, NULL::integer,
                j.sequence_key, i
            FROM unnest(ARRAY[found_job]) AS j;
            answered := answered || i;
        END LOOP;
        IF cardinality(answered) = wanted THEN
            RETURN;
        END IF;
    END IF;

    -- A replay answers the first job even at the cap: it asks for nothing new.
    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO found_job FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
          AND j.idempotency_key = p_idempotency_key;
        IF found_job.id IS NOT NULL THEN
            RETURN QUERY SELECT 'replayed', standing.role, standing.state, j.id,
                j.organization_id, j.requested_by, j.kind, j.status, j.attempts, j.max_attempts,
                j.progress, j.error_code, j.error_message, j.dedup_key, j.run_after,
                j.created_at, j.updated_at, j.started_at, j.finished_at, j.cancel_requested_at,
                j.leased_by, j.lease_until, j.result_expired_at, j.params, NULL, NULL::integer,
                j.sequence_key, 1
            FROM unnest(ARRAY[found_job]) AS j;
            RETURN;
        END IF;
    END IF;

    IF cardinality(answered) = 0 THEN
        kinds_left := p_kinds;
        caps_left := p_kind_quotas;
        step_kinds := ARRAY(SELECT unnest(workflow_step_kinds(u.kind, u.params))
                            FROM unnest(p_kinds, p_params) AS u (kind, params));
    ELSE
        kinds_left := ARRAY(SELECT u.kind FROM unnest(p_kinds) WITH ORDINALITY AS u (kind, place)
                            WHERE u.place <> ALL (answered) ORDER BY u.place);
        caps_left := ARRAY(SELECT u.cap FROM unnest(p_kind_quotas) WITH ORDINALITY AS u (cap, place)
                           WHERE u.place <> ALL (answered) ORDER BY u.place);
        step_kinds := ARRAY(SELECT unnest(workflow_step_kinds(u.kind, u.params))
                            FROM unnest(p_kinds, p_params) WITH ORDINALITY AS u (kind, params, place)
                            WHERE u.place <> ALL (answered) ORDER BY u.place);
    END IF;
    SELECT * INTO refusal
    FROM admit_jobs(p_organization_id, kinds_left || step_kinds, caps_left || ARRAY(
                        SELECT c.cap FROM unnest(step_kinds) WITH ORDINALITY AS k (kind, n)
                        LEFT JOIN unnest(p_quota_kinds, p_quota_caps) AS c (kind, cap)
                               ON c.kind = k.kind
                        ORDER BY k.n),
                    (SELECT q.active_jobs FROM quota_policy q), first_write);
    IF FOUND THEN
        RETURN QUERY SELECT 'over_quota', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, refusal.refused_kind, refusal.cap, NULL, NULL::integer;
        RETURN;
    END IF;

    RETURN QUERY
    WITH written AS (
        INSERT INTO jobs AS j (id, organization_id, requested_by, kind, params, max_attempts,
                               lease_seconds, dedup_key, idempotency_key, request_id, run_after,
                               retry_of, priority, traceparent, sequence_key, sequence_position,
                               debounce_seconds, submitted_as)
        SELECT n.id, p_organization_id, p_requested_by, n.kind, n.params,
               least(greatest(n.max_attempts, 1), 100), least(greatest(n.lease_seconds, 1), 86400),
               n.dedup_key, p_idempotency_key, p_request_id,
               CASE WHEN n.debounce IS NOT NULL AND n.dedup_key IS NOT NULL
                    THEN greatest(coalesce(n.run_after, now()),
                                  now() + n.debounce * interval '1 second')
                    ELSE coalesce(n.run_after, now()) END,
               -- an operator's retry-as-new-job points back at the job it retries, in its org
               (SELECT r.id FROM jobs r WHERE r.id = p_retry_of
                                           AND r.organization_id = p_organization_id),
               -- out of range is the column CHECK's refusal, never a silent clamp
               coalesce(n.priority, 0), p_traceparent, n.sequence_key,
               -- taken row by row in the batch's order (the subquery's), so places follow it
               CASE WHEN n.sequence_key IS NOT NULL THEN nextval('job_sequence_positions') END,
               CASE WHEN n.dedup_key IS NOT NULL
                         AND cardinality(workflow_step_kinds(n.kind, n.params)) = 0
                    THEN n.debounce END,
               -- who submits, when not the requester (job_history's birth)
               nullif(app_actor(), 'user:' || p_requested_by)
        FROM (SELECT u.* FROM unnest(p_ids, p_kinds, p_params, p_max_attempts, p_lease_seconds,
                                     p_dedup_keys, p_run_afters, p_priorities,
                                     coalesce(p_sequence_keys,
                                              array_fill(NULL::text, ARRAY[wanted])),
                                     coalesce(p_debounce_seconds,
                                              array_fill(NULL::integer, ARRAY[wanted])))
                  WITH ORDINALITY AS u (id, kind, params, max_attempts, lease_seconds,
                                        dedup_key, run_after, priority, sequence_key, debounce,
                                        place)
              WHERE u.place <> ALL (answered)
              ORDER BY u.place) AS n
        ON CONFLICT DO NOTHING
        RETURNING j.*
    ), audited AS (
        -- Who started each, for the organization's audit log: the scoped user (an operator's
        -- retry scopes the operator), else the requester.
        INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                               request_id)
        SELECT p_organization_id, coalesce(app_user(), p_requested_by),
               coalesce(app_actor(), 'user:' || p_requested_by), 'job.submit', w.id,
               CASE WHEN p_bulk THEN jsonb_build_object('kind', w.kind, 'bulk', true)
                    ELSE jsonb_strip_nulls(jsonb_build_object('kind', w.kind,
                                                              'retry_of', w.retry_of)) END,
               p_request_id
        FROM written w
    )
    SELECT 'created', standing.role, standing.state, w.id, w.organization_id,
        w.requested_by, w.kind, w.status, w.attempts, w.max_attempts, w.progress, w.error_code,
        w.error_message, w.dedup_key, w.run_after, w.created_at, w.updated_at, w.started_at,
        w.finished_at, w.cancel_requested_at, w.leased_by, w.lease_until, w.result_expired_at,
        w.params, NULL, NULL::integer, w.sequence_key, k.place::integer
    FROM written w JOIN unnest(p_ids) WITH ORDINALITY AS k (id, place) ON k.id = w.id;
    GET DIAGNOSTICS created = ROW_COUNT;
    IF cardinality(step_kinds) > 0 THEN
        -- The steps of each workflow written, counted as active from now on (reserve_children()).
        -- Only then: the statement triggers of job_reservations fire even for no row.
        INSERT INTO job_reservations AS r (parent_id, organization_id, kind, reserved)
        SELECT j.id, p_organization_id, s.kind, count(*)
        FROM jobs j, unnest(workflow_step_kinds(j.kind, j.params)) AS s (kind)
        WHERE j.id = ANY (p_ids)
        GROUP BY j.id, s.kind
        ON CONFLICT ON CONSTRAINT job_reservations_pkey
        DO UPDATE SET reserved = r.reserved + excluded.reserved;
    END IF;
    IF created + cardinality(answered) = wanted THEN
        RETURN;
    END IF;

    -- A conflict: the same Idempotency-Key committed meanwhile, or an active duplicate. Each
    -- lookup is a statement of its own, which sees what committed since the insert began.
    FOR missing IN
        SELECT k.place FROM unnest(p_ids) WITH ORDINALITY AS k (id, place)
        WHERE k.place <> ALL (answered) AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = k.id)
        ORDER BY k.place
    LOOP
        found_job := NULL;
        IF p_idempotency_key IS NOT NULL THEN
            SELECT * INTO found_job FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
              AND j.idempotency_key = p_idempotency_key;
        END IF;
        IF found_job.id IS NULL THEN
            -- The conflicting job may have ended in between: then there is nothing to name,
            -- and the caller may simply submit again.
            SELECT * INTO found_job FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.kind = p_kinds[missing]
              AND j.dedup_key = p_dedup_keys[missing]
              AND j.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
              AND (j.debounce_seconds IS NULL) = (p_debounce_seconds[missing] IS NULL);
        END IF;
        RETURN QUERY SELECT CASE WHEN p_idempotency_key IS NOT NULL
                                      AND j.idempotency_key IS NOT DISTINCT FROM p_idempotency_key
                                 THEN 'replayed' ELSE 'duplicate' END,
            standing.role, standing.state, j.id, j.organization_id, j.requested_by, j.kind,
            j.status, j.attempts, j.max_attempts, j.progress, j.error_code, j.error_message,
            j.dedup_key, j.run_after, j.created_at, j.updated_at, j.started_at, j.finished_at,
            j.cancel_requested_at, j.leased_by, j.lease_until, j.result_expired_at, j.params,
            NULL, NULL::integer, j.sequence_key, missing
        FROM unnest(ARRAY[found_job]) AS j;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                   integer[], integer[], text[], timestamptz[], integer, integer[],
                                   integer[], text, text[], text[], integer[], integer[], text, uuid,
                                   boolean)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                      integer[], integer[], text[], timestamptz[], integer,
                                      integer[], integer[], text, text[], text[], integer[],
                                      integer[], text, uuid, boolean)
    TO space_app, space_worker;

-- The previous release's single submit, kept so that its web still submits during a rolling
-- deploy: a batch of one of submit_jobs(), which is the only submit this release calls. Its
-- caller's rights are checked by submit_jobs() (SECURITY DEFINER); p_org_quota is ignored
-- there, as it was here. To be dropped by the next revision that changes the submit.
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
LANGUAGE sql SET search_path = public, pg_temp AS $$
    SELECT s.outcome, s.member_role, s.member_organization_state, s.id, s.organization_id,
           s.requested_by, s.kind, s.status, s.attempts, s.max_attempts, s.progress,
           s.error_code, s.error_message, s.dedup_key, s.run_after, s.created_at, s.updated_at,
           s.started_at, s.finished_at, s.cancel_requested_at, s.leased_by, s.lease_until,
           s.result_expired_at, s.params, s.quota_kind, s.quota_limit, s.sequence_key
    FROM submit_jobs(
        p_organization_id => p_organization_id, p_requested_by => p_requested_by,
        p_org_states => p_org_states, p_role => p_role, p_request_id => p_request_id,
        p_ids => ARRAY[gen_random_uuid()], p_kinds => ARRAY[p_kind], p_params => ARRAY[p_params],
        p_max_attempts => ARRAY[p_max_attempts], p_lease_seconds => ARRAY[p_lease_seconds],
        p_dedup_keys => ARRAY[p_dedup_key], p_run_afters => ARRAY[p_run_after],
        p_org_quota => NULL, p_kind_quotas => ARRAY[p_kind_quota],
        p_priorities => ARRAY[p_priority], p_traceparent => p_traceparent,
        p_sequence_keys => CASE WHEN p_sequence_key IS NOT NULL THEN ARRAY[p_sequence_key] END,
        p_quota_kinds => p_quota_kinds, p_quota_caps => p_quota_caps,
        p_debounce_seconds => CASE WHEN p_debounce_seconds IS NOT NULL
                                   THEN ARRAY[p_debounce_seconds] END,
        p_idempotency_key => p_idempotency_key, p_retry_of => p_retry_of, p_bulk => false) AS s
$$;
REVOKE ALL ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                  text, text, timestamptz, uuid, integer, integer, integer, text, text,
                                  integer, text[], integer[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                     text, text, timestamptz, uuid, integer, integer, integer, text, text,
                                     integer, text[], integer[])
    TO space_app, space_worker;
