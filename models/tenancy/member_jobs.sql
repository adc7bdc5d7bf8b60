-- A member's view of their organization's jobs, beyond the job store's own statements.

-- request_id_of --
SELECT request_id FROM jobs WHERE id = :id
