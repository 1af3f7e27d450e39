"""`models.<id>`: macro expansion, `${PORT}` assignment and the typed read into `ModelConfig`.

Models are expanded in sorted id order because that order decides which port each `${PORT}` gets.
Comment lines are dropped from `cmd`/`cmdStop` before expansion, so a commented-out `--port ${PORT}`
neither claims a port nor needs its macros to exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmswap.config import keys
from llmswap.config.capabilities_section import read_capabilities
from llmswap.config.commands import split_command, strip_comment_lines
from llmswap.config.common import is_http_url, read_filters, read_timeouts
from llmswap.config.errors import Problems
from llmswap.config.fields import Fields
from llmswap.config.kvcache_section import check_kv_model, model_kv_dir
from llmswap.config.macros import (
    Macro,
    apply_macros,
    apply_macros_to_keys,
    model_scope,
    read_macros,
    report_unresolved,
    report_unresolved_keys,
)
from llmswap.config.model import (
    DEFAULT_CONCURRENCY_LIMIT,
    KvCacheSettings,
    ModelConfig,
    Timeouts,
)
from llmswap.config.sleep_section import read_sleep_calls
from llmswap.config.yamltree import Entry, Map, Scalar, Seq, describe, to_python

DEFAULT_PROXY = "http://localhost:${PORT}"
PORT_REFERENCE = "${PORT}"
KV_DIR = "KV_DIR"
MAX_PORT = 65535
MIN_MODEL_HEALTH_CHECK_TIMEOUT = 1.0

MODEL_KEYS = keys.MODEL  # the keys the loader accepts here (llmswap.config.keys)


@dataclass(frozen=True)
class ModelDefaults:
    """The global values a model falls back to."""

    global_ttl: float
    unload_timeout: float
    health_check_timeout: float
    send_loading_state: bool
    kv_cache: KvCacheSettings
    prefetch: bool = True


@dataclass(frozen=True)
class NameSite:
    """A name a model answers to (alias or setParamsByID key) and where it was written."""

    name: str
    line: int
    path: str


@dataclass
class ModelDraft:
    config: ModelConfig
    aliases: list[NameSite] = field(default_factory=list)
    set_params_keys: list[NameSite] = field(default_factory=list)


def expand_model(
    model_id: str, entry: Entry, global_macros: list[Macro], next_port: int, problems: Problems,
    kv_root: Path,
) -> tuple[Fields | None, int | None]:
    """Expand macros and `${PORT}` inside one model; returns its fields and the port it took. `${KV_DIR}`
    is the model's folder under `kv_root`."""
    path = f"models.{model_id}"
    node = entry.node
    if not isinstance(node, Map):
        problems.error(
            entry.key_line,
            path,
            f"must be a mapping of model settings (cmd, proxy, ...), got {describe(node)}",
        )
        return None, None
    own_macros = read_macros(node.get("macros"), f"{path}.macros", problems)
    for key in ("cmd", "cmdStop"):
        command = node.get(key)
        if isinstance(command, Scalar) and isinstance(command.value, str):
            command.value = command.text = strip_comment_lines(command.value)
    proxy = node.get("proxy")
    proxy_is_default = proxy is None or (isinstance(proxy, Scalar) and proxy.value is None)
    if proxy_is_default:
        node.entries["proxy"] = Entry(
            "proxy", entry.key_line, Scalar(DEFAULT_PROXY, DEFAULT_PROXY, entry.key_line)
        )

    body = Map({key: e for key, e in node.entries.items() if key != "macros"}, node.line)
    by_id = _set_params_by_id(node)
    scope = model_scope(model_id, entry.key_line, global_macros, own_macros)
    scope.insert(1, Macro(KV_DIR, str(model_kv_dir(kv_root, model_id)), entry.key_line))
    apply_macros(body, scope)
    if by_id is not None:
        apply_macros_to_keys(by_id, scope, f"{path}.filters.setParamsByID", problems)

    port: int | None = None
    cmd = node.get("cmd")
    cmd_text = cmd.value if isinstance(cmd, Scalar) and isinstance(cmd.value, str) else ""
    proxy_node = node.entries["proxy"].node
    proxy_text = (
        proxy_node.value if isinstance(proxy_node, Scalar) and isinstance(proxy_node.value, str) else ""
    )
    if PORT_REFERENCE in cmd_text:
        if next_port > MAX_PORT:
            problems.error(
                entry.key_line,
                f"{path}.cmd",
                f"no port left for ${{PORT}}: startPort + models reach {next_port}",
            )
        else:
            port = next_port
        # On overflow, 0 stands in so the error above is not repeated for every ${PORT}.
        port_macro = [Macro("PORT", port or 0, entry.key_line)]
        apply_macros(body, port_macro)
        if by_id is not None:
            apply_macros_to_keys(by_id, port_macro, f"{path}.filters.setParamsByID", problems)
    elif PORT_REFERENCE in proxy_text:
        if cmd_text.strip() and proxy_is_default:  # the user wrote no proxy: the fix is in cmd
            problems.error(
                node.entries["cmd"].key_line,
                f"{path}.cmd",
                "cmd does not pass --port ${PORT}, so llmswap cannot tell where the server listens (proxy, "
                "not set, defaults to http://localhost:${PORT}); add --port ${PORT} to cmd, or set proxy to "
                "the URL the server listens on (e.g. http://127.0.0.1:8080)",
            )
        elif cmd_text.strip():  # a missing cmd is reported on its own
            problems.error(
                node.entries["proxy"].key_line,
                f"{path}.proxy",
                "proxy uses ${PORT} but cmd does not - ${PORT} is only available when used in cmd; use "
                "--port ${PORT} in cmd or a fixed port in proxy",
            )
        # Reported (or moot): keep report_unresolved from repeating it.
        assert isinstance(proxy_node, Scalar)
        proxy_node.value = proxy_node.text = proxy_text.replace(PORT_REFERENCE, "0")

    for key, value_entry in body.entries.items():
        report_unresolved(value_entry.node, f"{path}.{key}", problems, allow_pid=key == "cmdStop")
    if by_id is not None:
        report_unresolved_keys(by_id, f"{path}.filters.setParamsByID", problems)
    return Fields(node, path, problems, line=entry.key_line), port


def _set_params_by_id(node: Map) -> Map | None:
    filters = node.get("filters")
    if isinstance(filters, Map):
        by_id = filters.get("setParamsByID")
        if isinstance(by_id, Map):
            return by_id
    return None


def read_model(
    model_id: str, line: int, fields: Fields, port: int | None, defaults: ModelDefaults
) -> ModelDraft:
    """The `ModelConfig` of one expanded model, plus where its aliases were written."""
    fields.warn_unknown(keys.MODEL)
    cmd, cmd_text = _command(fields, "cmd", required=True)
    cmd_stop, _ = _command(fields, "cmdStop", required=False)

    proxy = fields.text("proxy").strip()
    if "${" not in proxy and not is_http_url(proxy):
        fields.error(
            "proxy",
            f"invalid proxy URL {proxy!r}; give the server's base URL, e.g. http://127.0.0.1:8080",
        )

    ttl = fields.number("ttl", -1.0, what="a number of seconds (-1 = globalTTL, 0 = never unload)")
    if ttl < -1:
        fields.error(
            "ttl",
            "must be -1 (use globalTTL), 0 (never unload) or a positive number of seconds, "
            f"got {_shown(ttl)}",
        )
        ttl = -1.0
    if ttl == -1:
        ttl = defaults.global_ttl

    unload_timeout = fields.number(
        "unloadTimeout", 0.0, minimum=0, accepted="0 (use the global unloadTimeout) or seconds"
    )
    health_check_timeout = defaults.health_check_timeout
    if fields.has("healthCheckTimeout"):
        health_check_timeout = fields.number("healthCheckTimeout", defaults.health_check_timeout)
        if health_check_timeout < MIN_MODEL_HEALTH_CHECK_TIMEOUT:
            fields.warn(
                "healthCheckTimeout",
                f"{_shown(health_check_timeout)} is below the minimum of 1 second, using 1",
            )
            health_check_timeout = MIN_MODEL_HEALTH_CHECK_TIMEOUT

    concurrency = fields.integer("concurrencyLimit", 0)
    if concurrency < 0:
        fields.warn(
            "concurrencyLimit",
            f"{concurrency} is not a limit, using the default of {DEFAULT_CONCURRENCY_LIMIT}",
        )
    env = _env(fields)
    gpus = _gpus(fields, env)
    aliases = _aliases(fields)
    filters = fields.mapping("filters", "a mapping of filter settings")
    kv_dir = model_kv_dir(defaults.kv_cache.dir, model_id)
    kv_cache = fields.flag("kvCache", False) and bool(cmd) and check_kv_model(fields, cmd, kv_dir)
    sleep_call, wake_call = read_sleep_calls(fields)
    draft = ModelDraft(
        ModelConfig(
            id=model_id,
            cmd=cmd,
            cmd_text=cmd_text,
            cmd_stop=cmd_stop,
            proxy=proxy,
            check_endpoint=fields.text("checkEndpoint", "/health").strip(),
            ttl=ttl,
            unload_timeout=unload_timeout or defaults.unload_timeout,
            health_check_timeout=health_check_timeout,
            aliases=tuple(site.name for site in aliases if site.name != model_id),
            env=env,
            use_model_name=fields.text("useModelName").strip(),
            unlisted=fields.flag("unlisted", False),
            name=fields.text("name").strip(),
            description=fields.text("description").strip(),
            concurrency_limit=concurrency if concurrency > 0 else DEFAULT_CONCURRENCY_LIMIT,
            filters=read_filters(filters),
            metadata=to_python(fields.mapping("metadata", "a mapping").map),
            send_loading_state=fields.flag("sendLoadingState", defaults.send_loading_state),
            prefetch=fields.flag("prefetch", defaults.prefetch),
            timeouts=read_timeouts(
                fields.mapping("timeouts", "a mapping of timeouts in seconds"), Timeouts()
            ),
            ignore_websockets=_compat(fields),
            capabilities=read_capabilities(fields),
            port=port,
            vram=fields.size("vram", None),
            gpus=gpus,
            persistent=fields.flag("persistent", False),
            deadline_ms=fields.number("deadlineMs", 0.0, minimum=0, what="milliseconds",
                                      accepted="0 (no deadline) or milliseconds after arrival"),
            kv_dir=kv_dir if str(kv_dir) in cmd_text else None,
            kv_cache=defaults.kv_cache if kv_cache else None,
            sleep_call=sleep_call,
            wake_call=wake_call,
            line=line,
        ),
        aliases=aliases,
    )
    by_id = filters.map.get("setParamsByID")
    if isinstance(by_id, Map):
        draft.set_params_keys = [
            NameSite(key, entry.key_line, f"{filters.path_of('setParamsByID')}.{key}")
            for key, entry in by_id.entries.items()
            if key != model_id and isinstance(entry.node, Map)
        ]
    return draft


def _shown(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)


def _command(fields: Fields, key: str, *, required: bool) -> tuple[tuple[str, ...], str]:
    text = strip_comment_lines(fields.text(key)).strip()
    if not text:
        if required and not isinstance(fields.node(key), Map | Seq):  # a wrong type was reported
            message = "is required: the command line that starts the model's server" + \
                fields.near_miss(key, MODEL_KEYS)
            if fields.has(key):
                message = "empty command; give the command line that starts the model's server"
            fields.error(key, message)
        return (), ""
    try:
        argv = split_command(text)
    except ValueError as exc:
        fields.error(key, f"cannot split the command line: {exc}; close the quote or escape it with \\")
        return (), text
    if not argv:
        fields.error(key, "empty command; give the command line that starts the model's server")
    return argv, text


def _env(fields: Fields) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for text, line, where in fields.texts("env", "a list of KEY=value strings"):
        key, sep, value = text.partition("=")
        if not sep or not key.strip() or key != key.strip():
            fields.problems.error(line, where, f"must be KEY=value, got {text!r}")
            continue
        pairs.append((key, value))
    return tuple(pairs)


def _gpus(fields: Fields, env: tuple[tuple[str, str], ...]) -> tuple[int, ...] | None:
    if fields.has("gpus"):
        devices: list[int] = []
        for index, item in enumerate(fields.items("gpus", "a list of device indexes such as [0, 1]")):
            if (
                not isinstance(item, Scalar)
                or isinstance(item.value, bool)
                or not isinstance(item.value, int)
                or item.value < 0
            ):
                fields.problems.error(
                    item.line,
                    f"{fields.path_of('gpus')}[{index}]",
                    f"must be a device index (0, 1, ...), got {describe(item)}",
                )
                continue
            devices.append(item.value)
        return tuple(devices)
    visible = [value for key, value in env if key == "CUDA_VISIBLE_DEVICES"]
    if not visible:
        return None
    text = visible[-1].strip()  # the last assignment is the one the process sees
    if text in ("", "-1"):
        return ()
    names = [part.strip() for part in text.split(",")]
    if all(name.isdigit() for name in names):
        return tuple(int(name) for name in names)
    fields.warn(
        "env",
        f"CUDA_VISIBLE_DEVICES={text} does not name device indexes; "
        "set gpus: [0, 1] to tell llmswap the devices",
    )
    return None


def _aliases(fields: Fields) -> list[NameSite]:
    sites: list[NameSite] = []
    for index, item in enumerate(fields.items("aliases", "a list of alias names")):
        where = f"{fields.path_of('aliases')}[{index}]"
        if isinstance(item, Map):
            # Newer llama-swap writes aliases as objects; the name is under `id`.
            alias_id = item.get("id")
            item = alias_id if alias_id is not None else item
        if not isinstance(item, Scalar) or item.value is None or not item.text.strip():
            fields.problems.error(item.line, where, f"must be an alias name, got {describe(item)}")
            continue
        sites.append(NameSite(item.text.strip(), item.line, where))
    return sites


def _compat(fields: Fields) -> bool:
    compat = fields.mapping("compat", "a mapping")
    compat.warn_unknown(keys.COMPAT)
    return compat.flag("ignoreWebsockets", False)
