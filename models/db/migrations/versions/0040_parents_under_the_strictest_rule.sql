-- A parent is acted on under the strictest rule of what it holds: job_role_needed() is the
-- least role a member needs to cancel, signal or read the result of a job (its kind's, and for
-- a parent the strictest of every kind within it). signal_job() takes it, keeps the sender's
-- role, and is bounded (a payload of at most 64 KiB, at most 10 signals a job has not taken).

-- The least role a member needs to act on a job (cancel it, signal it, read its result) by the
-- role rule of each kind: the job's own kind's, and for a parent the strictest of every kind
-- it holds or will make (its children and theirs, the steps of its workflow not made yet, its
-- fan-out's kind, a submitted workflow's steps). A parent is never easier to act on than what
-- is inside it: a plain member who may not cancel an admin's import step may not cancel the
-- workflow that holds it either, nor read the workflow's result, which carries the step's.
-- p_kind_roles: kind -> role, from the kinds' code (a kind it does not name needs an owner).
-- Only a job of the scoped organization (app_org()): NULL for any other, which every caller
-- treats as a refusal.
CREATE FUNCTION job_role_needed(p_id uuid, p_kind_roles jsonb) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    needed integer;
BEGIN
    WITH RECURSIVE tree AS (
        SELECT j.id, j.kind, j.params FROM jobs j
        WHERE j.id = p_id AND j.organization_id = app_org()
        UNION ALL
        SELECT c.id, c.kind, NULL::jsonb FROM tree t JOIN jobs c ON c.parent_id = t.id
    ), kinds AS (
        SELECT t.kind FROM tree t
        UNION
        SELECT s.step ->> 'kind'
        FROM tree t, jsonb_array_elements(
                 CASE WHEN t.kind = 'workflow' AND jsonb_typeof(t.params -> 'steps') = 'array'
                      THEN t.params -> 'steps' ELSE '[]'::jsonb END) AS s (step)
        UNION
        SELECT w.kind FROM job_workflow_steps w WHERE w.parent_id IN (SELECT t.id FROM tree t)
        UNION
        SELECT f.kind FROM job_fan_outs f WHERE f.parent_id IN (SELECT t.id FROM tree t)
    )
    SELECT max(coalesce(role_rank(p_kind_roles ->> k.kind), 3)) INTO needed FROM kinds k;
    RETURN (ARRAY['member', 'admin', 'owner'])[needed];
END $$;
REVOKE ALL ON FUNCTION job_role_needed(uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION job_role_needed(uuid, jsonb) TO space_app;

-- A member's signal to a job of the scoped organization, by the cancel rule: the requester, or
-- a current member holding the role the job needs (job_role_needed(): for a parent, the
-- strictest of what it holds; p_kind_roles as for request_cancel), in an organization that is
-- not deleted (a read-only one takes signals as it takes cancels: the kind's own rules decide at
-- its next run whether it may go on). It is kept, with who sent it and their role, until a wait
-- of the job takes it; a job waiting for that name is queued again at once. Bounded: a payload
-- of at most 64 KiB (as JSON text), and at most 10 signals a job has not taken yet.
-- Answers 'sent' (and the job's status), 'not_found' (no such job in this organization, or a
-- member who may not see it), 'finished', 'refused' (a member without the right), 'too_large'
-- or 'too_many' (nothing kept).
CREATE OR REPLACE FUNCTION signal_job(p_id uuid, p_name text, p_payload jsonb, p_user uuid,
                           p_kind_roles jsonb)
RETURNS TABLE (outcome text, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    max_payload CONSTANT integer := 65536;
    max_pending CONSTANT integer := 10;
    found_job jobs;
    member_role text;
BEGIN
    SELECT * INTO found_job FROM jobs j
    WHERE j.id = p_id AND j.organization_id = app_org() FOR UPDATE;
    SELECT m.role INTO member_role FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = app_org() AND m.user_id = p_user AND o.state <> 'deleted';
    IF found_job.id IS NULL OR member_role IS NULL THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::text;
        RETURN;
    END IF;
    IF found_job.status IN ('completed', 'failed', 'cancelled') THEN
        RETURN QUERY SELECT 'finished'::text, found_job.status;
        RETURN;
    END IF;
    IF found_job.requested_by <> p_user
       AND role_rank(member_role) < coalesce(role_rank(job_role_needed(p_id, p_kind_roles)), 4) THEN
        RETURN QUERY SELECT 'refused'::text, found_job.status;
        RETURN;
    END IF;
    IF octet_length(p_payload::text) > max_payload THEN
        RETURN QUERY SELECT 'too_large'::text, found_job.status;
        RETURN;
    END IF;
    -- The job's row is locked above: signals of one job are counted one sender at a time.
    IF (SELECT count(*) FROM job_signals s WHERE s.job_id = p_id AND s.taken_at IS NULL)
       >= max_pending THEN
        RETURN QUERY SELECT 'too_many'::text, found_job.status;
        RETURN;
    END IF;
    INSERT INTO job_signals (job_id, organization_id, name, payload, sent_by, sender_role)
    VALUES (p_id, found_job.organization_id, p_name, p_payload, p_user, member_role);
    IF found_job.status = 'waiting' AND found_job.wait_signal = p_name THEN
        UPDATE jobs j SET status = 'queued', run_after = now(), last_wakeup_at = NULL
        WHERE j.id = p_id;
        PERFORM pg_notify('spacejobs_jobs', '');
        RETURN QUERY SELECT 'sent'::text, 'queued'::text;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'sent'::text, found_job.status;
END $$;
REVOKE ALL ON FUNCTION signal_job(uuid, text, jsonb, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION signal_job(uuid, text, jsonb, uuid, jsonb) TO space_app;

