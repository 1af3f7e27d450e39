"""The top-level settings that are one value or a short list each: logging, `apiKeys`, the startup
preload, `upstream.ignorePaths`, and the request body and header limits."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from llmswap.config import keys as accepted
from llmswap.config.fields import Fields
from llmswap.config.model import (
    DEFAULT_CLIENT_HEADER_TIMEOUT,
    DEFAULT_MAX_REQUEST_BODY,
    DEFAULT_UPSTREAM_IGNORE_PATHS,
    ApiKey,
)
from llmswap.config.yamltree import Map, Scalar, describe

LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_TO_STDOUT = ("proxy", "upstream", "both", "none")
LOG_TIME_FORMATS = (
    "",
    "ansic",
    "unixdate",
    "rubydate",
    "rfc822",
    "rfc822z",
    "rfc850",
    "rfc1123",
    "rfc1123z",
    "rfc3339",
    "rfc3339nano",
    "kitchen",
    "stamp",
    "stampmilli",
    "stampmicro",
    "stampnano",
)


def read_choice(root: Fields, key: str, choices: tuple[str, ...], default: str) -> str:
    value = root.text(key, default).strip()
    if value not in choices:
        root.error(key, f"{key} must be one of: {', '.join(choices)}; got {value!r}")
        return default
    return value


def read_log_level(root: Fields) -> str:
    level = root.text("logLevel", "info").strip().lower()
    level = "warn" if level == "warning" else level
    if level not in LOG_LEVELS:
        root.warn("logLevel", f"unknown level {level!r}, using info (valid: {', '.join(LOG_LEVELS)})")
        return "info"
    return level


def read_log_time_format(root: Fields) -> str:
    value = root.text("logTimeFormat").strip()
    if value.lower() not in LOG_TIME_FORMATS:
        root.warn(
            "logTimeFormat", f"unknown format {value!r}, timestamps disabled (valid: rfc3339, kitchen, ...)"
        )
        return ""
    return value.lower()


def read_api_keys(root: Fields) -> tuple[ApiKey, ...]:
    keys: list[ApiKey] = []
    seen: set[str] = set()
    for index, item in enumerate(root.items("apiKeys", "a list of keys")):
        where = f"apiKeys[{index}]"
        if isinstance(item, Scalar):
            key, priority, max_concurrent, name, deadline_ms = item.text, 0, 0, "", 0.0
        elif isinstance(item, Map):
            fields = Fields(item, where, root.problems)
            fields.warn_unknown(accepted.API_KEY)
            key = fields.text("key")
            name = fields.text("name").strip()
            priority = fields.integer("priority", 0)
            max_concurrent = fields.integer(
                "maxConcurrent", 0, minimum=0, what="a whole number (0 = unlimited)"
            )
            deadline_ms = fields.number("deadlineMs", 0.0, minimum=0, what="milliseconds",
                                        accepted="0 (no deadline) or milliseconds after arrival")
        else:
            root.problems.error(
                item.line, where, f"must be a key or a mapping with key:, got {describe(item)}"
            )
            continue
        if not key.strip():
            root.problems.error(
                item.line, where, "empty api key found in apiKeys; give a key or remove the entry"
            )
            continue
        if re.search(r"\s", key):
            root.problems.error(
                item.line, where, "api key cannot contain spaces; check for a stray space or line break"
            )
            continue
        if key in seen:
            root.problems.warn(item.line, where, "this key is listed twice; the first entry is used")
            continue
        seen.add(key)
        keys.append(ApiKey(key=key, priority=priority, max_concurrent=max_concurrent, name=name,
                           deadline_ms=deadline_ms))
    return tuple(keys)


@dataclass(frozen=True)
class StartupHooks:
    """`hooks.on_startup`: the models to load, and the profile active at start-up and after each reload."""

    preload: tuple[str, ...] = ()  # real model ids
    profile: str | None = None


def read_startup_hooks(
    root: Fields, resolve: Callable[[str], str | None], selectors: Collection[str], profiles: Collection[str],
) -> StartupHooks:
    hooks = root.mapping("hooks", "a mapping with on_startup:")
    hooks.warn_unknown(accepted.HOOKS)
    on_startup = hooks.mapping("on_startup", "a mapping with preload: and profile:")
    on_startup.warn_unknown(accepted.ON_STARTUP)
    profile = on_startup.text("profile").strip() or None
    if profile is not None and profile not in profiles:
        known = ", ".join(sorted(profiles)) or "none is defined"
        on_startup.error("profile", f'"{profile}" is not a profile; name one of profiles: ({known})')
        profile = None
    return StartupHooks(_read_preload(root, on_startup, resolve, selectors), profile)


def _read_preload(
    root: Fields, on_startup: Fields, resolve: Callable[[str], str | None], selectors: Collection[str]
) -> tuple[str, ...]:
    preload: list[str] = []
    for name, line, where in on_startup.texts("preload", "a list of model ids or aliases"):
        name = name.strip()
        if not name:
            continue
        model = resolve(name)
        if model is None and name in selectors:
            root.problems.warn(line, where, f'"{name}" is a selector, not preloaded; list the model to load')
            continue
        if model is None:
            root.problems.warn(line, where, f'unknown model "{name}" is not preloaded')
            continue
        preload.append(model)
    return tuple(preload)


def read_ignore_paths(root: Fields) -> tuple[str, ...]:
    upstream = root.mapping("upstream", "a mapping with ignorePaths:")
    upstream.warn_unknown(accepted.UPSTREAM)
    patterns: list[str] = []
    for pattern, line, where in upstream.texts("ignorePaths", "a list of regular expressions"):
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            root.problems.error(line, where, f"invalid regular expression {pattern!r}: {exc}")
            continue
        patterns.append(pattern)
    return tuple(patterns) or DEFAULT_UPSTREAM_IGNORE_PATHS


def read_max_request_body(root: Fields) -> int:
    size = root.size("maxRequestBodySize", DEFAULT_MAX_REQUEST_BODY, default_unit="B")
    if size is None or size <= 0:
        root.error("maxRequestBodySize", "must be a positive size such as 32MiB")
        return DEFAULT_MAX_REQUEST_BODY
    return size


def read_client_header_timeout(root: Fields) -> float:
    seconds = root.number("clientHeaderTimeout", DEFAULT_CLIENT_HEADER_TIMEOUT)
    if seconds <= 0:
        root.error("clientHeaderTimeout", "must be a positive number of seconds (how long a client may take "
                   f"to send a request's headers), got {seconds:g}")
        return DEFAULT_CLIENT_HEADER_TIMEOUT
    return seconds
