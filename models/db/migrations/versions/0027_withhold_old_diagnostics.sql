-- Diagnostics recorded before this revision kept the exception's text, and PostgreSQL's errors
-- quote the values they refuse: a member's params or data reached the operators' job pages
-- through them. Diagnostics are now the exception chain's classes, SQLSTATEs and frames only
-- (models/diagnostics.py); the text of those recorded before is withheld, their class kept.
UPDATE job_diagnostics
SET traceback = 'withheld: recorded before diagnostics left out exception messages';
