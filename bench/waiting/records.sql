-- What bench.waiting reads from its stack's database, as the owner role (bench/waiting/records.py):
-- the job rows and the events their triggers wrote, one organization at a time (each figure
-- gives its jobs an organization of their own).

-- statuses --
SELECT status, count(*) AS jobs FROM jobs WHERE organization_id = :org GROUP BY status

-- holding_a_lease --
-- Jobs of the organization that hold a worker's slot: a lease, whatever its status says.
SELECT count(*) FROM jobs
WHERE organization_id = :org
  AND (status IN ('leased', 'cancel_requested') OR lease_token IS NOT NULL)

-- forget --
-- The waiting jobs of a figure that is over, so that the next figure's sweeps do not pass over
-- them (jobs_after_delete takes their events, steps and signals with them).
DELETE FROM jobs WHERE organization_id = :org

-- timers --
-- Per timer (bench_waiting.until), in seconds after its due moment (its params' `at`, which
-- sleep_until recorded as its step): its resume (the first waiting > queued event: beat's round
-- of due timers, or a sweep), the first lease after that resume, and the completion event; NULL
-- for what has not happened. The events are stamped with clock_timestamp() inside the statement
-- that made the change.
SELECT extract(epoch FROM r.at - CAST(j.params ->> 'at' AS timestamptz)) AS resumed_after,
       extract(epoch FROM (SELECT min(e.at) FROM job_history e
                           WHERE e.job_id = j.id AND e.to_status = 'leased' AND e.at >= r.at)
                          - CAST(j.params ->> 'at' AS timestamptz)) AS leased_after,
       extract(epoch FROM (SELECT max(e.at) FROM job_history e
                           WHERE e.job_id = j.id AND e.to_status = 'completed')
                          - CAST(j.params ->> 'at' AS timestamptz)) AS completed_after,
       EXISTS (SELECT 1 FROM job_history e
               WHERE e.job_id = j.id AND e.to_status = 'waiting') AS waited
FROM jobs j
CROSS JOIN LATERAL (SELECT min(e.at) AS at FROM job_history e
                    WHERE e.job_id = j.id AND e.from_status = 'waiting'
                      AND e.to_status = 'queued') r
WHERE j.organization_id = :org AND j.kind = 'bench_waiting.until'

-- drain_span --
-- Plain jobs of the organization: first lease to last completion (events), and how many
-- completed in one attempt with events exactly queued > leased > completed.
WITH chains AS (
    SELECT job_id, array_agg(to_status ORDER BY id) AS statuses,
           min(at) FILTER (WHERE to_status = 'leased') AS leased_at,
           max(at) FILTER (WHERE to_status = 'completed') AS completed_at
    FROM job_history WHERE organization_id = :org GROUP BY job_id
)
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE statuses = ARRAY['queued', 'leased', 'completed']) AS clean,
       extract(epoch FROM max(completed_at) - min(leased_at)) AS seconds
FROM chains

-- fan_span --
-- A fan-out parent and its children: the parent's first lease to its completion (events), how
-- many runs the parent took (its leases) and how many children completed in one clean chain.
WITH parent AS (
    SELECT id, status FROM jobs WHERE organization_id = :org AND parent_id IS NULL
), parent_events AS (
    SELECT min(e.at) FILTER (WHERE e.to_status = 'leased') AS leased_at,
           max(e.at) FILTER (WHERE e.to_status = 'completed') AS completed_at,
           count(*) FILTER (WHERE e.to_status = 'leased') AS runs
    FROM job_history e JOIN parent p ON p.id = e.job_id
), children AS (
    SELECT e.job_id, array_agg(e.to_status ORDER BY e.id) AS statuses
    FROM job_history e JOIN jobs c ON c.id = e.job_id
    WHERE c.organization_id = :org AND c.parent_id IS NOT NULL
    GROUP BY e.job_id
)
SELECT (SELECT string_agg(status, ',') FROM parent) AS parent_status,
       extract(epoch FROM pe.completed_at - pe.leased_at) AS seconds,
       pe.runs,
       (SELECT count(*) FROM children) AS children,
       (SELECT count(*) FROM children
        WHERE statuses = ARRAY['queued', 'leased', 'completed']) AS clean_children
FROM parent_events pe

-- chain_span --
-- A workflow (the organization's one job without a parent) and its steps: its submit (the
-- queued event of its insert) to its completion, the steps' own work (each step's lease to
-- its completion, summed: a chain's steps run one at a time), how many runs the workflow
-- took (its leases) and how many steps completed in one clean chain of events.
WITH workflow AS (
    SELECT id, status FROM jobs WHERE organization_id = :org AND parent_id IS NULL
), workflow_events AS (
    SELECT min(e.at) FILTER (WHERE e.from_status IS NULL) AS submitted_at,
           max(e.at) FILTER (WHERE e.to_status = 'completed') AS completed_at,
           count(*) FILTER (WHERE e.to_status = 'leased') AS runs
    FROM job_history e JOIN workflow w ON w.id = e.job_id
), steps AS (
    SELECT e.job_id, array_agg(e.to_status ORDER BY e.id) AS statuses,
           max(e.at) FILTER (WHERE e.to_status = 'completed')
               - min(e.at) FILTER (WHERE e.to_status = 'leased') AS work
    FROM job_history e JOIN jobs c ON c.id = e.job_id
    WHERE c.organization_id = :org AND c.parent_id IS NOT NULL
    GROUP BY e.job_id
)
SELECT (SELECT string_agg(status, ',') FROM workflow) AS workflow_status,
       extract(epoch FROM we.completed_at - we.submitted_at) AS seconds,
       (SELECT extract(epoch FROM sum(work)) FROM steps) AS work,
       we.runs,
       (SELECT count(*) FROM steps) AS steps,
       (SELECT count(*) FROM steps
        WHERE statuses = ARRAY['queued', 'leased', 'completed']) AS clean_steps
FROM workflow_events we

-- group_span --
-- A workflow (the organization's one job without a parent) whose steps may run side by side:
-- its submit to its completion, its steps' first lease to their last completion, how many
-- times a step was given back unstarted (leased > queued: a process that held it behind a long
-- job let another take it), and how many steps completed in exactly one completion.
WITH workflow AS (
    SELECT id, status FROM jobs WHERE organization_id = :org AND parent_id IS NULL
), workflow_events AS (
    SELECT min(e.at) FILTER (WHERE e.from_status IS NULL) AS submitted_at,
           max(e.at) FILTER (WHERE e.to_status = 'completed') AS completed_at
    FROM job_history e JOIN workflow w ON w.id = e.job_id
), step_events AS (
    SELECT e.* FROM job_history e JOIN jobs c ON c.id = e.job_id
    WHERE c.organization_id = :org AND c.parent_id IS NOT NULL
), steps AS (
    SELECT job_id, count(*) FILTER (WHERE to_status = 'completed') AS completions
    FROM step_events GROUP BY job_id
)
SELECT (SELECT string_agg(status, ',') FROM workflow) AS workflow_status,
       extract(epoch FROM we.completed_at - we.submitted_at) AS seconds,
       (SELECT extract(epoch FROM max(at) FILTER (WHERE to_status = 'completed')
                                  - min(at) FILTER (WHERE to_status = 'leased'))
        FROM step_events) AS steps_seconds,
       (SELECT count(*) FROM step_events
        WHERE from_status = 'leased' AND to_status = 'queued') AS given_back,
       (SELECT count(*) FROM steps) AS steps,
       (SELECT count(*) FROM steps WHERE completions = 1) AS completed_once
FROM workflow_events we

-- cancel_span --
-- A workflow whose step is a fan-out of bench.sleep (the organization's one job without a
-- parent, its step, the step's children): seconds from the workflow's cancel (its first event
-- out of a live status into cancel_requested or cancelled) to each grandchild's cancelled
-- event, and the statuses the tree ended in.
WITH workflow AS (
    SELECT id, status FROM jobs WHERE organization_id = :org AND parent_id IS NULL
), asked AS (
    SELECT min(e.at) AS at FROM job_history e JOIN workflow w ON w.id = e.job_id
    WHERE e.to_status IN ('cancel_requested', 'cancelled')
), grandchildren AS (
    SELECT g.id, g.status FROM jobs g
    JOIN jobs c ON c.id = g.parent_id JOIN workflow w ON w.id = c.parent_id
), reached AS (
    SELECT max(e.at) AS at FROM job_history e JOIN grandchildren g ON g.id = e.job_id
    WHERE e.to_status = 'cancelled'
)
SELECT (SELECT string_agg(status, ',') FROM workflow) AS workflow_status,
       (SELECT string_agg(DISTINCT status, ',') FROM grandchildren) AS grandchild_statuses,
       (SELECT count(*) FROM grandchildren) AS grandchildren,
       extract(epoch FROM (SELECT at FROM reached) - (SELECT at FROM asked)) AS seconds
