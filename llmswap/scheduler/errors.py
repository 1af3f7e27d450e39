"""Errors a scheduler hands to a waiting request through `Effects.grant_error`.

Each carries the HTTP status the server answers with, so the server maps them without knowing
which scheduler produced them. Messages follow llama-swap's wording where clients may match on it.
"""

from __future__ import annotations


class SchedulerError(Exception):
    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after  # seconds, for 429/503; None = no Retry-After header


class ModelNotFound(SchedulerError):
    status = 404
    code = "not_found"

    def __init__(self, model: str) -> None:
        super().__init__("no local server found for requested model")
        self.model = model


class ConcurrencyLimit(SchedulerError):
    """The model's `concurrencyLimit` (or an API key's `maxConcurrent`) is reached."""

    status = 429
    code = "concurrency_limit"

    def __init__(self, message: str = "Too many requests", *, retry_after: float = 1.0) -> None:
        super().__init__(message, retry_after=retry_after)


class QueueFull(SchedulerError):
    """Admission control: a waiting-request bound is hit (429 per model, 503 global)."""

    code = "queue_full"

    def __init__(self, message: str, *, status: int, retry_after: float) -> None:
        super().__init__(message, retry_after=retry_after)
        self.status = status


class QueueTimeout(SchedulerError):
    status = 503
    code = "queue_timeout"


class Shed(SchedulerError):
    """Admission `shed-lowest`: this waiter was dropped to admit a higher-priority request."""

    status = 503
    code = "shed"


class DeadlineMissed(SchedulerError):
    """The request can no longer be served by its deadline (`onDeadline: reject`)."""

    status = 503
    code = "deadline_missed"


class Preempted(SchedulerError):
    """This in-flight request was ended to make room for a higher-priority one (preemptBelow)."""

    status = 503
    code = "preempted"


class SwapFailed(SchedulerError):
    """Starting the model failed (spawn error, premature exit, health-check timeout, ...)."""

    status = 500
    code = "swap_failed"


class ModelUnloaded(SchedulerError):
    status = 500
    code = "model_unloaded"


class ShuttingDown(SchedulerError):
    status = 500
    code = "shutting_down"


class CannotFit(SchedulerError):
    """A swapper says the target can never run (e.g. larger than the whole memory budget)."""

    status = 500
    code = "cannot_fit"
