-- Job events without foreign keys (issue 8, measured): every event row is written by the
-- jobs_after_insert/jobs_after_update triggers from a jobs row in the same statement, and nobody
-- else may write one (least privilege, revision 0006), so the two foreign keys checked nothing
-- that could fail; yet each cost an index probe and a row lock per event, two events per job on
-- the hot path (about 8 of ~46 buffer reads per claimed job, 9 of ~33 per finished one, read in
-- pg_stat_statements). What the ON DELETE CASCADE did, statement triggers on jobs now do: a
-- job's events go with it, whether it is deleted by retention, by its organization's deletion
-- (a cascade from organizations), or truncated.
ALTER TABLE job_events DROP CONSTRAINT job_events_job_id_fkey;
ALTER TABLE job_events DROP CONSTRAINT job_events_organization_id_fkey;

CREATE FUNCTION jobs_after_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM job_events e USING gone_jobs g WHERE e.job_id = g.id;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_after_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS gone_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_delete();

CREATE FUNCTION jobs_after_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    TRUNCATE job_events;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_after_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_truncate();

REVOKE ALL ON FUNCTION jobs_after_delete() FROM PUBLIC;
REVOKE ALL ON FUNCTION jobs_after_truncate() FROM PUBLIC;
