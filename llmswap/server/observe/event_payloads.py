"""The payloads of `/api/events`, built from the live config and router: pure functions, no I/O.

llama-swap's types keep llama-swap's shapes (`modelStatus`, `uiConfig`, `profileChanged`); llmswap's own
types (`snapshot`, `processEvent`, `queue`, `swap`) carry what llama-swap has no word for: swap decisions
with their reasons, queue counts, footprints. The README's "Events" table documents each one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmswap import __version__
from llmswap.config.model import Config
from llmswap.kvcache.keeper import KvReport
from llmswap.process.events import ProcessEvent
from llmswap.process.state import ProcessState
from llmswap.router.router import Router
from llmswap.router.types import SwapPhase
from llmswap.scheduler.types import SwapPlan
from llmswap.server.inference.peers import peer_models
from llmswap.server.observe.records import render_capabilities

# The state a process is in once it has reported each event (see llmswap.process.process). Read from the
# event rather than from a router: after a config reload the router that hears it may not own the process.
STATE_AFTER: Mapping[str, ProcessState] = {
    "starting": ProcessState.STARTING,
    "ready": ProcessState.READY,
    "start_failed": ProcessState.STOPPED,
    "stopping": ProcessState.STOPPING,
    "stopped": ProcessState.STOPPED,
    "exited": ProcessState.STOPPED,
    "ttl_expired": ProcessState.READY,  # its stop follows at once
    "slept": ProcessState.SLEEPING,
    "woke": ProcessState.READY,
}

# llama-swap's default `ui.activity.session_id`: the request headers its UI groups activity by.
DEFAULT_SESSION_HEADERS = ("X-Session-ID", "X-Litellm-Session-Id")


def shown_state(state: ProcessState | None) -> str:
    """A process state as modelStatus shows it: llama-swap's four states (`shutdown` shows as stopped)."""
    if state is None or state is ProcessState.SHUTDOWN:
        return ProcessState.STOPPED.value
    return state.value


def model_aliases(config: Config, model_id: str) -> list[str]:
    """The model's declared aliases, then the other names that lead to it (setParamsByID's)."""
    declared = list(config.models[model_id].aliases)
    others = sorted(name for name, target in config.aliases.items()
                    if target == model_id and name not in declared)
    return declared + others


def model_status(
    config: Config, router: Router, overrides: Mapping[str, ProcessState] | None = None
) -> list[dict[str, Any]]:
    """`modelStatus`: every local model sorted by id with its state, then one entry per peer model.

    `overrides` gives the state a model is known to be in when the router has not caught up yet (the
    event being reported says so)."""
    overrides = overrides or {}
    entries: list[dict[str, Any]] = []
    for model_id in sorted(config.models):
        model = config.models[model_id]
        state = overrides.get(model_id) or router.model_state(model_id)
        entry: dict[str, Any] = {
            "id": model_id, "name": model.name, "description": model.description, "state": shown_state(state),
            "unlisted": model.unlisted, "peerID": "",
        }
        aliases = model_aliases(config, model_id)
        if aliases:
            entry["aliases"] = aliases
        if model.capabilities is not None:
            rendered = render_capabilities(model.capabilities)
            if "capabilities" in rendered:
                entry["capabilities"] = rendered["capabilities"]
            if "context_length" in rendered:
                entry["context_length"] = rendered["context_length"]
        entries.append(entry)
    for served in peer_models(config):
        entries.append({"id": served.id, "name": "", "description": "", "state": "", "unlisted": False,
                        "peerID": served.peer.id})
    return entries


def ui_config(config: Config) -> dict[str, Any]:
    """`uiConfig`. llmswap reads no `ui:` section yet, so this is llama-swap's default."""
    return {"activity": {"session_id": list(DEFAULT_SESSION_HEADERS)}}


def profile_changed(active: str | None) -> dict[str, Any]:
    """`profileChanged`: the active profile, null when none is."""
    return {"active": active or None}


def no_profile() -> str | None:
    """The active profile while llmswap has no profiles: none."""
    return None


@dataclass
class SwapRecord:
    """One swap as the `swap` events and the snapshot's history show it."""

    id: int
    plan: SwapPlan
    started: float
    duration: float | None = None
    error: str | None = None
    finished: bool = False
    phases: tuple[SwapPhase, ...] = ()  # once finished: what it spent where

    def as_dict(self, phase: str) -> dict[str, Any]:
        outcome = "pending" if not self.finished else ("ok" if self.error is None else "failed")
        return {
            "id": self.id, "phase": phase, "model": self.plan.model, "evict": list(self.plan.evict),
            "rule": self.plan.rule, "detail": self.plan.detail, "request_seq": self.plan.request_seq,
            "started": self.started, "duration": self.duration, "outcome": outcome, "error": self.error,
            "phases": [{"phase": p.phase, "model": p.model, "seconds": round(p.seconds, 4)}
                       for p in self.phases],
        }


@dataclass(frozen=True)
class QueueCounts:
    waiting: int = 0
    in_flight: int = 0
    loading: bool = False

    def as_dict(self, model: str) -> dict[str, Any]:
        return {"model": model, "waiting": self.waiting, "in_flight": self.in_flight, "loading": self.loading}


def kv_event(model: str, report: KvReport, now: float) -> dict[str, Any]:
    """`kvcache`: a model's slots saved (during a stop) or restored (during a start)."""
    return {"model": model, "action": report.action, "slots": report.slots, "tokens": report.tokens,
            "bytes": report.bytes, "seconds": round(report.seconds, 4), "failed": report.failed, "time": now}


def process_event(event: ProcessEvent, pid: int | None, now: float) -> dict[str, Any]:
    """`processEvent` for one step of an upstream process's life."""
    return {
        "model": event.model, "state": STATE_AFTER[event.kind].value, "event": event.kind, "pid": pid,
        "detail": event.detail, "exit_code": event.exit_code, "duration": event.duration, "time": now,
    }


def snapshot(
    router: Router,
    *,
    reason: str,
    now: float,
    started_at: float,
    swaps: list[dict[str, Any]],
) -> dict[str, Any]:
    """llmswap's `snapshot`: everything its status page draws, on connect and after dropped frames."""
    counts = router.snapshot()
    models = []
    for model_id in sorted(router.processes):
        process = router.processes[model_id]
        model = process.config
        last_start = process.last_start_duration
        models.append({
            "id": model_id, "name": model.name, "description": model.description,
            "aliases": list(model.aliases), "unlisted": model.unlisted,
            "state": shown_state(router.model_state(model_id)),
            "in_flight": counts.in_flight.get(model_id, 0), "waiting": counts.waiting.get(model_id, 0),
            "loading": model_id in counts.loading, "pid": process.pid,
            "last_start_seconds": round(last_start, 3) if last_start is not None else None,
            "ttl": model.ttl, "extras": router.model_extras(model_id),
        })
    return {
        "reason": reason, "time": now, "router": router.name, "version": __version__,
        "started_at": started_at, "models": models, "router_extras": router.router_extras(), "swaps": swaps,
    }
