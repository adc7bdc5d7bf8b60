-- What the database says about the chaos run's workflows, fan-outs and waiting jobs: read as
-- the owner of the run's own database (results, steps and signals are tenant data no
-- application role reads across organizations), never written.

-- parents --
-- Every workflow and fan-out parent, with its terminal events and the moment its cancel took
-- effect: a cancel is always a stored event, whose at is clock_timestamp() in the jobs trigger,
-- which runs at the END of the statement that changed the row. The cancel statement
-- (request_cancel) moves the parent to cancel_requested or cancelled AND every child it can see
-- to cancelled or cancel_requested, locking each; a claim that had locked a child first commits
-- before that statement goes on.
-- So the parent's first '-> cancel_requested' or '-> cancelled' event is stamped after every
-- child that could still start legitimately had started (or been stopped by it): a child
-- leased or created after that stamp is a step that started after its workflow's cancel.
SELECT p.id::text AS id, p.kind, p.status, p.params, p.result,
       (SELECT count(*) FROM job_history e
         WHERE e.job_id = p.id AND e.to_status IN {TERMINAL})
           AS terminal_events,
       (SELECT min(e.at) FROM job_history e
         WHERE e.job_id = p.id AND e.to_status IN ('cancel_requested', 'cancelled')) AS cancelled_at
  FROM jobs p
 WHERE p.parent_id IS NULL AND p.kind = ANY (CAST(:kinds AS text[]))

-- children --
SELECT c.parent_id::text AS parent_id, c.child_index, c.id::text AS id, c.status, c.result,
       (SELECT count(*) FROM job_history e WHERE e.job_id = c.id AND e.to_status = 'completed')
           AS completions
  FROM jobs c
 WHERE c.parent_id IS NOT NULL

-- started_after_cancel --
-- Children leased (a first claim, a claim after a resume, a re-lease after expiry) or created
-- after their parent's cancel took effect (see parents above), with how long after. A child's
-- creation is its birth in job_history: its row's created_at, which the statements that make
-- children stamp with clock_timestamp() as they insert it.
-- One lease after the stamp is not a step started after the cancel: the jobs trigger stamps the
-- parent's event before it stops the children (stop_children()), and a child made while the
-- cancel's lock_tree() waited (its snapshot did not hold it) may be locked by a claim then; the
-- cancel waits for that claim to commit and then stops the child, in the cancel's own
-- transaction. The claim committed first: it started before the cancel did anything. A lease
-- the cancel's transaction stopped afterwards (its stop event written by the same transaction
-- as the parent's cancel event) is that case; any other lease after the stamp is a step that
-- started after the cancel.
WITH cancels AS (
    SELECT DISTINCT ON (e.job_id) e.job_id AS parent_id, e.at, e.xmin AS cancelled_by
      FROM job_events e JOIN jobs p ON p.id = e.job_id
     WHERE p.parent_id IS NULL AND e.to_status IN ('cancel_requested', 'cancelled')
     ORDER BY e.job_id, e.at
)
SELECT c.parent_id::text AS parent_id, c.id::text AS id, c.child_index,
       coalesce(e.from_status, 'created') || ' -> ' || e.to_status AS event,
       extract(epoch FROM e.at - k.at) AS seconds_after
  FROM cancels k
  JOIN jobs c ON c.parent_id = k.parent_id
  JOIN job_history e ON e.job_id = c.id
 WHERE e.at > k.at AND (e.to_status = 'leased' OR e.from_status IS NULL)
   AND NOT (e.to_status = 'leased' AND EXISTS (
           SELECT 1 FROM job_events s
            WHERE s.job_id = c.id AND s.id > e.id AND s.xmin = k.cancelled_by
              AND s.to_status IN ('cancel_requested', 'cancelled')))
 ORDER BY e.at

-- steps_cancelled_alone --
-- Children cancelled although their parent was neither cancelled nor failed (a fail-fast
-- workflow cancels what is left of it when a step fails).
SELECT count(*) FROM jobs c JOIN jobs p ON p.id = c.parent_id
 WHERE c.status = 'cancelled' AND p.status NOT IN ('cancelled', 'failed')

-- draws --
-- The random draw each chaos.fan recorded as its first step.
SELECT job_id::text AS id, result FROM job_steps WHERE name = :name

-- timers --
-- Every bench.wait job that completed, with the moment its timer recorded (its first run's
-- 'sleep#1' step) and its completion event: a timer must never fire before its moment.
SELECT j.id::text AS id, CAST(s.result #>> '{}' AS timestamptz) AS due, e.at AS completed_at
  FROM jobs j
  JOIN job_steps s ON s.job_id = j.id AND s.name = 'sleep#1'
  JOIN job_history e ON e.job_id = j.id AND e.to_status = 'completed'
 WHERE j.kind = 'bench.wait'

-- signals --
-- Every bench.await_signal job: its result, the signals it was sent and took, and whether the
-- first came before the job first waited (kept for the wait) or after (it resumed the job).
SELECT j.id::text AS id, j.status, j.result,
       (SELECT count(*) FROM job_signals s WHERE s.job_id = j.id) AS sent,
       (SELECT count(*) FROM job_signals s WHERE s.job_id = j.id AND s.taken_at IS NOT NULL)
           AS taken,
       (SELECT min(s.sent_at) FROM job_signals s WHERE s.job_id = j.id) AS sent_at,
       (SELECT min(e.at) FROM job_history e WHERE e.job_id = j.id AND e.to_status = 'waiting')
           AS first_waited_at
  FROM jobs j
 WHERE j.kind = 'bench.await_signal'

-- waits_met --
-- Waiting jobs whose condition has come: a timer (or a signal's deadline) past its moment by
-- more than :slack seconds (the sweeper resumes those, every sweep interval), an untaken signal
-- of the name it waits for (signal_job() resumes it in the sender's transaction), its children
-- settled (the jobs trigger resumes it in the finish of the child that settled them). One
-- statement, so one snapshot: of the last two, none may ever be seen.
SELECT j.id::text AS id, j.kind, w.met
  FROM jobs j
 CROSS JOIN LATERAL (SELECT CASE
        WHEN j.wait_until < now() - :slack * interval '1 second' THEN 'a due timer'
        WHEN j.wait_signal IS NOT NULL AND EXISTS (
                 SELECT 1 FROM job_signals s
                  WHERE s.job_id = j.id AND s.name = j.wait_signal AND s.taken_at IS NULL)
            THEN 'an untaken signal'
        -- A fan-out or workflow the database runs is settled when the last child it made has
        -- ended (a fail_fast workflow also at a failed step); a parent of the older kind when
        -- fewer children are active than when it began to wait.
        WHEN j.wait_children IS NOT NULL AND CASE
                 WHEN EXISTS (SELECT 1 FROM job_fan_outs f WHERE f.parent_id = j.id)
                     THEN NOT EXISTS (SELECT 1 FROM job_fan_outs f
                                       WHERE f.parent_id = j.id AND f.ended < f.total)
                 WHEN EXISTS (SELECT 1 FROM job_workflows w WHERE w.parent_id = j.id)
                     THEN NOT EXISTS (SELECT 1 FROM job_workflows w
                                       WHERE w.parent_id = j.id AND w.ended < w.released
                                         AND NOT (w.policy = 'fail_fast' AND w.failed > 0))
                 ELSE j.wait_children > (
                          SELECT count(*) FROM jobs c
                           WHERE c.parent_id = j.id
                             AND c.status IN {ACTIVE})
             END
            THEN 'children ended'
        END AS met) w
 WHERE j.status = 'waiting' AND w.met IS NOT NULL
