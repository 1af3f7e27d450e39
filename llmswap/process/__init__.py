"""Upstream process lifecycle: one `Process` per model (start, health check, stop, TTL, output)."""

from llmswap.process.errors import StartAborted, StartFailed
from llmswap.process.events import ProcessEvent, StopCause
from llmswap.process.logring import LogEntry, LogRing, LogSubscription
from llmswap.process.process import Process, shutdown_all
from llmswap.process.state import ProcessState

__all__ = [
    "LogEntry",
    "LogRing",
    "LogSubscription",
    "Process",
    "ProcessEvent",
    "ProcessState",
    "StartAborted",
    "StartFailed",
    "StopCause",
    "shutdown_all",
]
