"""Domain errors: a stable code and a sentence that is safe to show the user.

The web maps ``code`` to an HTTP status in one place (webapp.errors); the runner stores ``code``
and ``message`` as the job's ``error_code``/``error_message``, which operators read too (/ops).
A message never carries a traceback, SQL, a URL, a token or another tenant's data, and a job's
never quotes its params (a workflow names its steps by place, not by the member's names).
"""

from __future__ import annotations


class DomainError(Exception):
    code = "error"
    message = "The request could not be completed."
    #: a permanent error fails a job at once instead of retrying it
    permanent = True

    def __init__(self, message: str | None = None, *, permanent: bool | None = None,
                 **details: object) -> None:
        self.message = message or type(self).message
        if permanent is not None:
            self.permanent = permanent
        self.details = details
        super().__init__(self.message)


class InvalidRequest(DomainError):
    code = "invalid_request"
    message = "The request is not valid."


class InvalidParams(DomainError):
    code = "invalid_params"
    message = "The job parameters are not valid."


class UnknownKind(DomainError):
    code = "unknown_kind"
    message = "There is no job of that kind."


class NotFound(DomainError):
    code = "not_found"
    message = "Not found."


class Unauthorized(DomainError):
    code = "unauthorized"
    message = "A valid bearer token is required."


class InsufficientRole(DomainError):
    code = "insufficient_role"
    message = "Your role in this organization does not allow this operation."


class RequesterNotMember(DomainError):
    code = "requester_not_member"
    message = "The user who started this job is no longer a member of the organization."


class OrganizationUnavailable(DomainError):
    code = "organization_unavailable"
    message = "The organization is not available for this operation."


class OrganizationReadOnly(DomainError):
    code = "organization_read_only"
    message = "The organization is read-only."


class DuplicateJob(DomainError):
    code = "duplicate_job"
    message = "An identical job is already queued or running."


class IdempotencyKeyReused(DomainError):
    code = "idempotency_key_reused"
    message = "This Idempotency-Key was already used for a different request."


class TooManyJobs(DomainError):
    """An organization's cap on active jobs (or on one kind's) is reached; nothing was written."""

    code = "too_many_jobs"
    message = "This organization has reached its limit of active jobs."
    #: seconds a client should wait before trying again (jobs must finish to make room)
    retry_after = 10


class TooManySignals(DomainError):
    """A job holds as many signals as it may without having taken them; nothing was kept."""

    code = "too_many_signals"
    message = ("This job already holds as many signals as it may before it takes them; send "
               "again once it has taken one.")


class NoStepWaits(DomainError):
    """A signal sent to a workflow that no step of it waits for now; nothing was kept (a workflow
    never waits for a signal itself, so a signal kept for it would never be taken)."""

    code = "no_step_waits"
    message = ("No step of this workflow waits for this signal now, and a workflow takes no "
               "signal itself: nothing was kept. Send it again once a step waits for it, or to "
               "the step's own id (the workflow's steps list them).")


class RateLimited(DomainError):
    code = "rate_limited"
    message = "Too many requests; slow down."


class Unavailable(DomainError):
    code = "unavailable"
    message = "The service is temporarily unavailable."


class JobNotCompleted(DomainError):
    code = "job_not_completed"
    message = "The job has not completed."


class ResultExpired(DomainError):
    code = "result_expired"
    message = "The job's result is past its retention period and was deleted."


class ResultMissing(DomainError):
    code = "result_missing"
    message = ("The job's result file is missing from the results store. Start a new job for a "
               "fresh result; if it happens again, contact support.")


class JobFinished(DomainError):
    code = "job_finished"
    message = "The job has already finished."


class NotResumable(DomainError):
    """A resume of a job that is not a failed or cancelled workflow (``status`` says what it is)."""

    code = "job_not_resumable"
    message = "Only a failed or cancelled workflow can be resumed."


class AlreadyResumed(DomainError):
    """A resume of a workflow that was resumed (or retried) before: resume that one
    (``resumed_as``) instead, so that one failed run never goes on twice."""

    code = "already_resumed"
    message = "This workflow was resumed already: resume the newer workflow instead."


class TimedOut(DomainError):
    code = "timed_out"
    message = "The job took longer than its time limit."


class ResultNotStorable(DomainError):
    """A job returned what PostgreSQL's jsonb cannot hold; it would fail the same way again."""

    code = "result_not_storable"
    message = ("The job's result cannot be kept: it holds a NUL character, NaN or an infinite "
               "number.")


class InternalJobError(DomainError):
    """What the user sees of an unexpected exception; the detail goes to job_diagnostics."""

    code = "internal_error"
    message = "The job failed because of an internal error."
    permanent = False


class LeaseLost(Exception):
    """The worker no longer holds the job: stop at once, write nothing."""


class CancelRequested(Exception):
    """The user asked to cancel: stop at the next safe point."""


class ReleaseRequested(Exception):
    """The worker is shutting down and the grace period is over: give the job back."""


class WaitRequested(Exception):
    """The kind waits (a moment, a signal, its children): end this run, give the lease and the
    slot back, and run the job again from the top when what it waits for has come. Raised by
    the context's waits (models.jobs.context), never by a kind itself."""

    def __init__(self, *, until: object = None, signal: str | None = None,
                 children: int | None = None) -> None:
        super().__init__("waiting")
        self.until = until  # a datetime (aware), or None
        self.signal = signal
        #: how many of its children the job saw active when it decided to wait (None: it does
        #: not wait for children); one that ends before the wait is recorded resumes it at once.
        #: A fan-out waits with 1: resumed once none is left (the database makes the rest).
        self.children = children


class SignalTimeout(DomainError):
    code = "signal_timeout"
    message = "The signal the job waited for did not come in time."
