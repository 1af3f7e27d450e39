"""Load a llama-swap configuration file (plus llmswap's additions) into a frozen `Config`.

The pipeline follows llama-swap's: `${env.NAME}` on the text, YAML parsing, global macros on every
top-level value but `models`, then per model (sorted ids) its macros, `${PORT}`, and the checks for
macros left over. Then the typed reads, the alias map, peers, routing, selectors, profiles, hooks,
keys and tasks. Every
problem found on the way is collected; `ConfigError` lists them all, each with file, line and key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from llmswap.config import keys
from llmswap.config.access_section import read_allowed_hosts, read_allowed_origins
from llmswap.config.activity_section import read_activity, read_performance
from llmswap.config.envsubst import mark_env, substitute_env, written_form
from llmswap.config.errors import ConfigError, Problem, Problems, in_file_order
from llmswap.config.fields import Fields
from llmswap.config.kvcache_section import read_kv_cache
from llmswap.config.macros import Macro, apply_macros, read_macros, report_unresolved
from llmswap.config.model import (
    DEFAULT_HEALTH_CHECK_TIMEOUT,
    DEFAULT_MAX_SLEEPING,
    DEFAULT_START_PORT,
    DEFAULT_UNLOAD_TIMEOUT,
    MIN_HEALTH_CHECK_TIMEOUT,
    Config,
)
from llmswap.config.models_section import ModelDefaults, ModelDraft, expand_model, read_model
from llmswap.config.peers_section import read_peers
from llmswap.config.profiles_section import read_profiles
from llmswap.config.routing_section import read_routing
from llmswap.config.selectors_section import Names, read_selectors
from llmswap.config.settings_section import (
    LOG_TO_STDOUT,
    read_api_keys,
    read_choice,
    read_client_header_timeout,
    read_ignore_paths,
    read_log_level,
    read_log_time_format,
    read_max_request_body,
    read_startup_hooks,
)
from llmswap.config.sleep_section import read_max_sleeping
from llmswap.config.tasks_section import read_tasks, resolve_path
from llmswap.config.yamltree import Map, parse_document

TOP_LEVEL_KEYS = keys.ROOT  # the keys the loader accepts here (llmswap.config.keys)
# llama-swap features llmswap does not have; a llama-swap file carrying them still loads.
IGNORED_TOP_LEVEL_KEYS = keys.ROOT.ignored  # the keys the loader accepts here (llmswap.config.keys)
DEFAULT_STATE_DIR = ".llmswap-state"
# Where the state goes when the config names no stateDir: a service unit or a container image sets it to
# its state directory or volume, so a config copied from llama-swap needs no edit.
STATE_DIR_ENV = "LLMSWAP_STATE_DIR"


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read and load the config file at `path`. Raises `ConfigError`."""
    return load_config_text(read_config_text(path), path=str(path), environ=environ)


def read_config_text(path: str | Path) -> str:
    """The text of a config file; raises `ConfigError` when it cannot be read or is not UTF-8."""
    shown = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            [Problem(shown, None, "", f"cannot read the config file: {reason}; check the path")]
        ) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            [Problem(shown, line, "", "the file is not UTF-8 text; save it as UTF-8")]
        ) from None


def parse_config_text(text: str, problems: Problems, environ: Mapping[str, str] | None = None) -> Map:
    """`${env.NAME}` substituted, then parsed: the tree `load_tree` reads. Raises `ConfigError`."""
    text = substitute_env(text, os.environ if environ is None else environ, problems)
    return parse_document(text, problems)


def load_config_text(
    text: str, *, path: str = "config.yaml", environ: Mapping[str, str] | None = None
) -> Config:
    """Load config text; `path` names it in messages and anchors relative paths. Raises `ConfigError`."""
    problems = Problems(path)
    tree = parse_config_text(text, problems, environ)
    written = parse_written_text(text, path) if uses_env(text) else None
    return load_tree(tree, problems, path=path, base_dir=Path(path).expanduser().absolute().parent,
                     written=written)


def uses_env(text: str) -> bool:
    return "${env." in text


def parse_written_text(text: str, path: str) -> Map:
    """The tree of `text` with every `${env.NAME}` kept as written, for what is shown to people."""
    return parse_document(mark_env(text), Problems(path))  # the real parse reports every problem


def load_tree(
    tree: Map, problems: Problems, *, path: str, base_dir: Path, written: Map | None = None
) -> Config:
    """The `Config` a parsed tree describes; `problems` names its file(s); `written` is the same tree with
    `${env.NAME}` kept (see `parse_written_text`), for the commands shown to people. Raises `ConfigError`."""
    root = Fields(tree, "", problems)
    root.warn_unknown(keys.ROOT, keys.ROOT.ignored)

    global_macros = read_macros(tree.get("macros"), "macros", problems)
    for key, entry in tree.entries.items():
        if key in ("models", "macros") or key not in TOP_LEVEL_KEYS:
            continue
        apply_macros(entry.node, global_macros)
        report_unresolved(entry.node, key, problems)

    health_check_timeout = root.number("healthCheckTimeout", DEFAULT_HEALTH_CHECK_TIMEOUT)
    if health_check_timeout < MIN_HEALTH_CHECK_TIMEOUT:
        root.warn(
            "healthCheckTimeout",
            f"{health_check_timeout:g} is below the minimum of {MIN_HEALTH_CHECK_TIMEOUT:g} seconds, "
            f"using {MIN_HEALTH_CHECK_TIMEOUT:g} (a model's own healthCheckTimeout may be shorter)",
        )
        health_check_timeout = MIN_HEALTH_CHECK_TIMEOUT
    start_port = root.integer("startPort", DEFAULT_START_PORT, what="a port number")
    if not 1 <= start_port <= 65535:
        root.error(
            "startPort", f"startPort must be greater than 1 (a port from 1 to 65535), got {start_port}"
        )
        start_port = DEFAULT_START_PORT
    global_ttl = root.number("globalTTL", 0.0, minimum=0, accepted="0 (never unload) or seconds")
    unload_timeout = root.number("unloadTimeout", 0.0, minimum=0) or DEFAULT_UNLOAD_TIMEOUT
    send_loading_state = root.flag("sendLoadingState", False)
    prefetch = root.flag("prefetch", True)
    default_state = os.environ.get(STATE_DIR_ENV, "").strip() or DEFAULT_STATE_DIR
    state_dir = resolve_path(root.text("stateDir").strip() or default_state, base_dir)
    kv_cache = read_kv_cache(root, state_dir, base_dir)
    defaults = ModelDefaults(global_ttl, unload_timeout, health_check_timeout, send_loading_state, kv_cache,
                             prefetch)

    models = _read_models(root, global_macros, start_port, defaults)
    if written is not None:
        models = _with_written_commands(models, written, path, start_port, defaults)
    aliases = _alias_map(models, problems)
    model_ids = {model_id: None for model_id in models}  # ordered set: YAML order

    def resolve(name: str) -> str | None:
        return name if name in models else aliases.get(name)

    peers = read_peers(root, model_ids, aliases)
    routing = read_routing(root, model_ids, aliases)
    names = Names(model_ids, aliases, peers)
    selectors = read_selectors(root, names, routing)  # after peers, before profiles (as llama-swap)
    profiles = read_profiles(root, names, selectors)
    hooks = read_startup_hooks(root, resolve, selectors, profiles)
    config = Config(
        path=Path(path),
        models=MappingProxyType({model_id: draft.config for model_id, draft in models.items()}),
        aliases=MappingProxyType(aliases),
        peers=MappingProxyType(peers),
        routing=routing,
        selectors=MappingProxyType(selectors),
        profiles=MappingProxyType(profiles),
        health_check_timeout=health_check_timeout,
        start_port=start_port,
        global_ttl=global_ttl,
        unload_timeout=unload_timeout,
        log_level=read_log_level(root),
        log_to_stdout=read_choice(root, "logToStdout", LOG_TO_STDOUT, "proxy"),
        log_time_format=read_log_time_format(root),
        send_loading_state=send_loading_state,
        prefetch=prefetch,
        include_aliases_in_list=root.flag("includeAliasesInList", False),
        api_keys=read_api_keys(root),
        preload=hooks.preload,
        startup_profile=hooks.profile,
        upstream_ignore_paths=read_ignore_paths(root),
        max_request_body=read_max_request_body(root),
        client_header_timeout=read_client_header_timeout(root),
        state_dir=state_dir,
        kv_cache=kv_cache,
        max_sleeping=read_max_sleeping(root, DEFAULT_MAX_SLEEPING),
        tasks=read_tasks(root, base_dir, resolve),
        allowed_origins=read_allowed_origins(root),
        allowed_hosts=read_allowed_hosts(root),
        activity=read_activity(root, base_dir),
        performance=read_performance(root),
        warnings=tuple(str(warning) for warning in in_file_order(problems.warnings)),
    )
    problems.raise_if_errors()
    return config


def _read_models(
    root: Fields, global_macros: list[Macro], start_port: int, defaults: ModelDefaults
) -> dict[str, ModelDraft]:
    section = root.mapping("models", "a mapping of model ids to model settings")
    drafts: dict[str, ModelDraft] = {}
    next_port = start_port
    for model_id in sorted(section.names()):  # sorted: this order hands out the ${PORT}s
        entry = section.map.entries[model_id]
        if not model_id.strip():
            section.error(model_id, "a model id must not be empty")
            continue
        fields, port = expand_model(model_id, entry, global_macros, next_port, root.problems,
                                    defaults.kv_cache.dir)
        if fields is None:
            continue
        if port is not None:
            next_port = port + 1
        drafts[model_id] = read_model(model_id, entry.key_line, fields, port, defaults)
    return {model_id: drafts[model_id] for model_id in section.names() if model_id in drafts}


def _with_written_commands(
    models: dict[str, ModelDraft], tree: Map, path: str, start_port: int, defaults: ModelDefaults
) -> dict[str, ModelDraft]:
    """`models` with each one's commands and env as written: the same expansion run once more over the
    tree with every `${env.NAME}` kept, so what is displayed never holds an environment value."""
    ignored = Problems(path)  # the real load reported every problem already
    marked = _read_models(Fields(tree, "", ignored), read_macros(tree.get("macros"), "macros", ignored),
                          start_port, defaults)
    drafts: dict[str, ModelDraft] = {}
    for model_id, draft in models.items():
        twin = marked.get(model_id)
        if twin is not None:
            draft = dataclasses.replace(draft, config=dataclasses.replace(
                draft.config,
                cmd_written=written_form(twin.config.cmd_text),
                cmd_stop_written=written_form(" ".join(twin.config.cmd_stop)),
                env_written=tuple((key, written_form(value)) for key, value in twin.config.env),
            ))
        drafts[model_id] = draft
    return drafts


def _alias_map(models: dict[str, ModelDraft], problems: Problems) -> dict[str, str]:
    """Declared aliases first (file order), then setParamsByID keys (sorted models), as llama-swap does."""
    aliases: dict[str, str] = {}
    alias_line: dict[str, int] = {}
    for model_id, draft in models.items():
        for site in draft.aliases:
            if site.name == model_id:
                problems.warn(site.line, site.path, f"{site.name} is the model's own id; ignored")
            elif site.name in models:
                problems.error(
                    site.line, site.path, f"alias {site.name} is also a model id; rename the alias"
                )
            elif site.name in aliases:
                problems.error(
                    site.line,
                    site.path,
                    f"duplicate alias {site.name} found in model: {model_id} "
                    f"(already an alias of {aliases[site.name]} at {problems.where(alias_line[site.name])})",
                )
            else:
                aliases[site.name] = model_id
                alias_line[site.name] = site.line
    for model_id in sorted(models):
        for site in models[model_id].set_params_keys:
            if site.name in models:
                problems.error(
                    site.line,
                    site.path,
                    f"model {model_id} filters.setParamsByID: key '{site.name}' "
                    "conflicts with an existing model ID",
                )
            elif site.name in aliases:
                if aliases[site.name] != model_id:
                    problems.error(
                        site.line,
                        site.path,
                        f"duplicate alias '{site.name}' in model {model_id} filters.setParamsByID, "
                        f"already used by model {aliases[site.name]} "
                        f"({problems.where(alias_line[site.name])})",
                    )
            else:
                aliases[site.name] = model_id
                alias_line[site.name] = site.line
    return aliases
