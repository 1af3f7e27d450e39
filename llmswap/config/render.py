"""`format_config`: a loaded `Config` as YAML text, for `llmswap check-config FILE`.

It shows what llmswap will actually use: macros expanded, ports assigned, defaults filled in,
aliases resolved, each command's argv as it will be executed — but as written where it takes an
`${env.NAME}`, and with secret-looking values masked (`masking.py`). API keys are shortened so the output
can be pasted into a bug report. Warnings come first, as YAML comments.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from llmswap.config.commands import split_command
from llmswap.config.masking import MASK, mask_secrets
from llmswap.config.model import (
    Capabilities,
    Config,
    Filters,
    ModelConfig,
    PeerConfig,
    RouterConfig,
    SchedulerConfig,
    TasksConfig,
    Timeouts,
)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (commands) as `|` blocks, read-only mappings as plain ones."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


def _represent_mapping(dumper: yaml.SafeDumper, data: Mapping[str, Any]) -> yaml.MappingNode:
    return dumper.represent_dict(dict(data))


_Dumper.add_representer(str, _represent_str)
_Dumper.add_multi_representer(Mapping, _represent_mapping)  # type: ignore[type-abstract]  # MappingProxyType too


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _redact(key: str) -> str:
    return f"{key[:4]}… ({len(key)} characters)" if len(key) >= 12 else f"… ({len(key)} characters)"


def _pruned(values: dict[str, Any]) -> dict[str, Any]:
    """`values` without the settings left empty (None, "", (), {}, False)."""
    return {
        key: value for key, value in values.items() if value is not False and value not in (None, "", [], {})
    }


def _timeouts(timeouts: Timeouts) -> dict[str, Any]:
    return {
        "connect": _number(timeouts.connect),
        "keepalive": _number(timeouts.keepalive),
        "responseHeader": _number(timeouts.response_header),
        "tlsHandshake": _number(timeouts.tls_handshake),
        "expectContinue": _number(timeouts.expect_continue),
        "idleConn": _number(timeouts.idle_conn),
        "wall": _number(timeouts.wall),
        "idle": _number(timeouts.idle),
    }


def _filters(filters: Filters) -> dict[str, Any]:
    return _pruned(
        {
            "stripParams": ", ".join(filters.strip_params),
            "setParams": dict(filters.set_params),
            "setParamsByID": {key: dict(value) for key, value in filters.set_params_by_id.items()},
        }
    )


def _capabilities(capabilities: Capabilities | None) -> dict[str, Any] | None:
    if capabilities is None:
        return None
    return _pruned(
        {
            "in": list(capabilities.input),
            "out": list(capabilities.output),
            "tools": capabilities.tools,
            "reranker": capabilities.reranker,
            "context": capabilities.context,
        }
    )


def _argv(model: ModelConfig) -> list[str]:
    """The argv that runs, as written (`${env.NAME}` kept) and with secret-looking values masked."""
    try:
        argv = split_command(model.cmd_written) if model.cmd_written else model.cmd
    except ValueError:
        return [model.cmd_shown]
    shown = [mask_secrets(arg) for arg in argv]  # `--key=X`, `HF_TOKEN=X`, `Authorization: Bearer X`
    for index in range(len(shown) - 1):  # `--api-key X`: the flag and its value are two arguments
        if mask_secrets(shlex.join(shown[index:index + 2])).endswith(" " + MASK):
            shown[index + 1] = MASK
    return shown


def _model(model: ModelConfig) -> dict[str, Any]:
    core = {
        "cmd": model.cmd_shown,
        "argv": _argv(model),
        "cmdStop": mask_secrets(model.cmd_stop_written or " ".join(model.cmd_stop)),
        "port": model.port,
        "proxy": model.proxy,
        "checkEndpoint": model.check_endpoint,
        "ttl": _number(model.ttl),
        "unloadTimeout": _number(model.unload_timeout),
        "healthCheckTimeout": _number(model.health_check_timeout),
        "concurrencyLimit": model.concurrency_limit,
        "sendLoadingState": model.send_loading_state,
        "prefetch": model.prefetch,
    }
    extra = _pruned(
        {
            "aliases": list(model.aliases),
            "env": list(model.env_shown),
            "useModelName": model.use_model_name,
            "unlisted": model.unlisted,
            "name": model.name,
            "description": model.description,
            "filters": _filters(model.filters),
            "metadata": dict(model.metadata),
            "timeouts": _timeouts(model.timeouts) if model.timeouts != Timeouts() else None,
            "compat": {"ignoreWebsockets": True} if model.ignore_websockets else None,
            "capabilities": _capabilities(model.capabilities),
            "vram": model.vram,
            "persistent": model.persistent,
            "deadlineMs": _number(model.deadline_ms) if model.deadline_ms else None,
            "kvCache": True if model.kv_cache is not None else None,
            "sleep": " ".join(model.sleep_call) if model.sleep_call else None,
            "wake": " ".join(model.wake_call) if model.wake_call else None,
        }
    )
    if model.gpus is not None:  # an empty list means "no GPU", so it is shown
        extra["gpus"] = list(model.gpus)
    return {**{key: value for key, value in core.items() if value is not None and value != ""}, **extra}


def _peer(peer: PeerConfig) -> dict[str, Any]:
    return _pruned(
        {
            "proxy": peer.proxy,
            "apiKey": _redact(peer.api_key) if peer.api_key else "",
            "models": list(peer.models),
            "filters": _filters(peer.filters),
            "timeouts": _timeouts(peer.timeouts),
        }
    )


def _router(router: RouterConfig) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "groups": {
            group.id: {
                "swap": group.swap,
                "exclusive": group.exclusive,
                "persistent": group.persistent,
                "members": list(group.members),
            }
            for group in router.groups.values()
        }
    }
    if router.matrix is not None:
        settings["matrix"] = {
            "vars": dict(router.matrix.vars),
            "sets": dict(router.matrix.sets),
            "evict_costs": dict(router.matrix.evict_costs),
        }
    if router.use == "vram":
        settings["budget"] = router.vram.budget
        settings["reserve"] = router.vram.reserve
        settings["evict_costs"] = {key: _number(value) for key, value in router.vram.evict_costs.items()}
    return {"use": router.use, "settings": settings}


def _scheduler(scheduler: SchedulerConfig) -> dict[str, Any]:
    batch = scheduler.batch
    admission = scheduler.admission
    return {
        "use": scheduler.use,
        "settings": {
            "fifo": {"priority": dict(scheduler.priority)},
            "batch": {
                "maxWait": _number(batch.max_wait),
                "minResidency": _number(batch.min_residency),
                "priority": dict(batch.priority),
            },
            "prioritizer": scheduler.prioritizer,
            "onDeadline": scheduler.on_deadline,
            "preemptBelow": scheduler.preempt_below,
        },
        "admission": {
            "maxQueue": admission.max_queue,
            "maxQueuePerModel": admission.max_queue_per_model,
            "policy": admission.policy,
            "queueTimeout": _number(admission.queue_timeout),
        },
    }


def _tasks(tasks: TasksConfig | None) -> dict[str, Any] | None:
    if tasks is None:
        return None
    return {
        "db": mask_secrets(str(tasks.db)),
        "host": tasks.host,
        "leaseSeconds": _number(tasks.lease_seconds),
        "maxQueueDepth": tasks.max_queue_depth,
        "priority": tasks.priority,
        "maxPreemptions": tasks.max_preemptions,
        "types": {
            name: _pruned({"model": task_type.model, "vram": task_type.vram})
            for name, task_type in tasks.types.items()
        },
    }


def format_config(config: Config, *, warnings: bool = True) -> str:
    """The resolved config as YAML (camelCase keys, effective values), warnings first as comments unless
    `warnings` is False (check-config prints them on stderr instead)."""
    document: dict[str, Any] = {
        "healthCheckTimeout": _number(config.health_check_timeout),
        "startPort": config.start_port,
        "globalTTL": _number(config.global_ttl),
        "unloadTimeout": _number(config.unload_timeout),
        "logLevel": config.log_level,
        "logToStdout": config.log_to_stdout,
        "logTimeFormat": config.log_time_format,
        "sendLoadingState": config.send_loading_state,
        "includeAliasesInList": config.include_aliases_in_list,
        "maxRequestBodySize": config.max_request_body,
        "clientHeaderTimeout": _number(config.client_header_timeout),
        "stateDir": str(config.state_dir) if config.state_dir is not None else None,
        "kvCache": {"dir": str(config.kv_cache.dir), "maxSize": config.kv_cache.max_size,
                    "saveTimeout": _number(config.kv_cache.save_timeout),
                    "restoreTimeout": _number(config.kv_cache.restore_timeout),
                    "save": config.kv_cache.save} if config.kv_cache else None,
        "maxSleeping": config.max_sleeping,
        "prefetch": config.prefetch,
        "apiKeys": [
            {"key": _redact(key.key), "priority": key.priority, "maxConcurrent": key.max_concurrent,
             **({"deadlineMs": _number(key.deadline_ms)} if key.deadline_ms else {})}
            for key in config.api_keys
        ],
        "cors": {"allowedOrigins": [pattern.text for pattern in config.allowed_origins]},
        "allowedHosts": [pattern.text for pattern in config.allowed_hosts],
        "upstream": {"ignorePaths": list(config.upstream_ignore_paths)},
        "hooks": {"on_startup": {"preload": list(config.preload),
                                 **({"profile": config.startup_profile} if config.startup_profile else {})}},
        "models": {model_id: _model(model) for model_id, model in config.models.items()},
        "aliases": dict(config.aliases),
        "peers": {peer_id: _peer(peer) for peer_id, peer in config.peers.items()},
        "routing": {
            "router": _router(config.routing.router),
            "scheduler": _scheduler(config.routing.scheduler),
        },
        "tasks": _tasks(config.tasks),
        "selectors": {
            selector.id: _pruned({
                "strategy": selector.strategy, "targets": list(selector.targets),
                "settings": {"spillover": selector.spillover} if selector.strategy == "spillover" else None,
                "name": selector.name, "description": selector.description,
                "unlisted": selector.unlisted or None, "metadata": dict(selector.metadata) or None,
            })
            for selector in config.selectors.values()
        } or None,
        "profiles": {
            profile.id: {"description": profile.description, "pins": dict(profile.pins)}
            for profile in config.profiles.values()
        } or None,
    }
    document = {key: value for key, value in document.items() if value is not None}
    header = "".join(f"# warning: {warning}\n" for warning in config.warnings) if warnings else ""
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=float("inf"))
    return header + body
