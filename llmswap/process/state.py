"""The states of an upstream process, shared by the process machinery and the schedulers."""

from __future__ import annotations

from enum import StrEnum


class ProcessState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    SLEEPING = "sleeping"  # alive, its pid unchanged, its GPU memory freed (`sleep:`/`wake:` servers)
    SHUTDOWN = "shutdown"  # terminal: the router is gone, the process never starts again

    @property
    def is_running(self) -> bool:
        """Whether the process occupies resources (llama-swap's RunningModels: not stopped, not shutdown).
        A sleeping one does not: the routers count it stopped, and its next request wakes it like a start."""
        return self in RUNNING


RUNNING = frozenset((ProcessState.STARTING, ProcessState.READY, ProcessState.STOPPING))
