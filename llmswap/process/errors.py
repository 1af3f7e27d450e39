"""Why a start did not end with a ready upstream: the errors `Process.ensure_ready()` raises."""

from __future__ import annotations


class StartFailed(Exception):
    """The upstream could not be made ready: spawn error, premature exit, health-check timeout, port taken."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class StartAborted(StartFailed):
    """The start was cut short on purpose: a stop (or the proxy's shutdown) arrived while it was starting."""

    def __init__(self, message: str = "start aborted") -> None:
        super().__init__(message)
