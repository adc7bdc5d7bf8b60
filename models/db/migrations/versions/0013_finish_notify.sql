-- Finishes notify, revision 0013: a job that ends says so on channel spacejobs_finished (at COMMIT),
-- so the Python API's wait() needs no polling. The trigger is 0004's, with that one addition.
CREATE OR REPLACE FUNCTION jobs_after_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
