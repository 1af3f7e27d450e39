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


def spawn_problem(exc: BaseException, program: str, path: str) -> str:
    """Why a command could not be started, with the fix when the program is not where it was looked for."""
    if isinstance(exc, FileNotFoundError) and exc.filename in (program, None):
        if "/" in program:
            return f"{program} does not exist; fix the path in cmd"
        return (f"{program!r} is not on PATH ({path or 'empty'}); give its full path in cmd, or add its "
                f"folder to PATH (a model's env can set PATH)")
    if isinstance(exc, PermissionError) and exc.filename in (program, None):
        return f"{program} is not executable (chmod +x it) or not a program"
    return str(exc)
