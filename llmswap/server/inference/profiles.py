"""Profiles at run time: which profile is active, its routes (`GET /api/profiles`, `PUT
/api/profiles/active`, llama-swap's bodies and errors), its pins' `/v1/models` records, and the
`ProfileChanged` event a real switch publishes.

None is active at start-up, and every config reload starts again with none (without an event), as in
llama-swap: the active profile belongs to one config; `hooks.on_startup.profile` names one to be active
instead, at start-up and after each reload. A request reads the active profile once, when
its model is resolved; a switch never changes a request already past that point.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from aiohttp import web

from llmswap.config.model import Config, ProfileConfig
from llmswap.router.router import Router
from llmswap.server.http.errors import error_response
from llmswap.server.inference.peers import resolve_peer
from llmswap.server.observe.event_feed import TYPED_EVENTS
from llmswap.server.observe.events import FEED

log = logging.getLogger("llmswap.profiles")


@dataclass(frozen=True)
class ProfileChanged:
    """Published on the event bus when the active profile really changes (None: no profile active)."""

    active: str | None


NO_PINS: Mapping[str, str] = MappingProxyType({})


class ActiveProfile:
    """The active profile of one config (a reload replaces this object, so none is active after it).

    `pins` maps a requested name to its pinned target ("" = disabled): every request reads it as its model
    is resolved, so it is kept ready rather than looked up through the profile each time."""

    def __init__(self, config: Config, name: str | None = None) -> None:
        self.config = config
        self.name: str | None = None
        self.pins: Mapping[str, str] = NO_PINS
        self.switch(name)

    def switch(self, name: str | None) -> None:
        """Make `name` (a profile of this config, or None) the active one."""
        self.name = name
        profile = self.profile
        self.pins = profile.pins if profile is not None else NO_PINS

    @property
    def profile(self) -> ProfileConfig | None:
        return self.config.profiles.get(self.name) if self.name is not None else None


class Profiles:
    """The live config's `ActiveProfile`: at start and again after every reload, the config's
    `hooks.on_startup.profile` (none without one, as in llama-swap)."""

    def __init__(self, config: Config) -> None:
        self.active = ActiveProfile(config, config.startup_profile)
        if config.startup_profile is not None:
            log.info("active profile at start-up: %s (hooks.on_startup.profile)", config.startup_profile)

    def follow(self, router: Router) -> None:
        # Called inside a reload with the new router, before any request sees it: the start-up one again.
        config = router.config
        if config is not self.active.config:
            self.active = ActiveProfile(config, config.startup_profile)


PROFILES: web.AppKey[Profiles] = web.AppKey("llmswap_profiles", Profiles)


def setup(app: web.Application) -> None:
    profiles = app[PROFILES]
    app[FEED].active_profile = lambda: profiles.active.name
    TYPED_EVENTS[ProfileChanged] = lambda feed, _change: feed.profile_changed()
    app.router.add_get("/api/profiles", list_profiles)
    app.router.add_put("/api/profiles/active", set_active)


async def list_profiles(request: web.Request) -> web.Response:
    current = request.app[PROFILES].active
    profiles = [
        {"id": profile.id, "description": profile.description, "pins": dict(profile.pins)}
        for profile in sorted(current.config.profiles.values(), key=lambda p: p.id)
    ]
    return web.json_response({"active": current.name, "profiles": profiles})


async def set_active(request: web.Request) -> web.Response:
    try:
        body = json.loads(await request.read())
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return error_response(request, 400, "invalid profile request")
    if "name" not in body:
        return error_response(request, 400, "profile name is required")
    name = body["name"]
    if name is not None and not isinstance(name, str):
        return error_response(request, 400, "profile name must be a string or null")
    wanted = name or None
    current = request.app[PROFILES].active
    if wanted is not None and wanted not in current.config.profiles:
        return error_response(request, 404, f'profile "{wanted}" not found')
    if wanted != current.name:
        current.switch(wanted)
        log.info("active profile changed to %s", json.dumps(wanted))
        request.app[FEED].publish(ProfileChanged(wanted))
    return web.json_response({"active": current.name})


def pin_records(config: Config, profile: ProfileConfig | None, created: int) -> list[dict[str, Any]]:
    """`/v1/models` records for the active profile's pins that name nothing else (llama-swap's rule)."""
    if profile is None:
        return []
    records = []
    for pin, target in profile.pins.items():
        if not target or pin in config.selectors or config.real_model_name(pin) is not None \
                or resolve_peer(config, pin) is not None:
            continue
        records.append({"id": pin, "object": "model", "created": created, "owned_by": "llmswap",
                        "meta": {"llamaswap": {"type": "profile"}}, "status": {"value": "unloaded"}})
    return records
