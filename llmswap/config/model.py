"""The resolved configuration: frozen dataclasses built by `loader.py`, never mutated afterwards.

Every value here is final: macros expanded, `${PORT}` assigned, defaults applied (`ttl: -1` already
replaced by `globalTTL`, `unloadTimeout: 0` by the global value, ...). YAML names are camelCase,
Python names snake_case; the docstring of each field says which YAML key it comes from when the
two differ beyond case.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llmswap.config.commands import split_command
from llmswap.config.masking import mask_secrets
from llmswap.config.origins import HostPattern, OriginPattern

DEFAULT_GROUP_ID = "(default)"
DEFAULT_CONCURRENCY_LIMIT = 10
DEFAULT_HEALTH_CHECK_TIMEOUT = 120.0
MIN_HEALTH_CHECK_TIMEOUT = 15.0
DEFAULT_UNLOAD_TIMEOUT = 10.0
DEFAULT_START_PORT = 5800
DEFAULT_MAX_REQUEST_BODY = 32 * 1024 * 1024
DEFAULT_CLIENT_HEADER_TIMEOUT = 60.0  # seconds a client has to send a request's headers
DEFAULT_KV_MAX_SIZE = 20 * 1024**3
DEFAULT_MAX_SLEEPING = 2
DEFAULT_UPSTREAM_IGNORE_PATHS = (r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$",)

EMPTY: Mapping[str, Any] = MappingProxyType({})


def _no_entries() -> Any:
    # dataclasses reject an unhashable default such as a mappingproxy; a factory returning the
    # shared read-only EMPTY is equivalent.
    return field(default_factory=lambda: EMPTY)


@dataclass(frozen=True)
class Timeouts:
    """`models.<id>.timeouts` / `peers.<id>.timeouts`: upstream transport, seconds, 0 = no limit."""

    connect: float = 30.0
    keepalive: float = 30.0
    response_header: float = 0.0
    tls_handshake: float = 10.0
    expect_continue: float = 1.0
    idle_conn: float = 90.0
    wall: float = 0.0  # llmswap: the watchdog's bound on a whole answer, from the grant (0 = none)
    idle: float = 0.0  # llmswap: the watchdog's bound on a gap between the upstream's bytes (0 = none)


@dataclass(frozen=True)
class Filters:
    """`filters:` of a model or a peer, applied to JSON request bodies."""

    strip_params: tuple[str, ...] = ()  # split, trimmed, deduplicated, sorted, `model` removed
    set_params: Mapping[str, Any] = _no_entries()  # `model` removed
    set_params_by_id: Mapping[str, Mapping[str, Any]] = _no_entries()  # requested name -> params


@dataclass(frozen=True)
class Capabilities:
    """`models.<id>.capabilities`, rendered in `/v1/models`."""

    input: tuple[str, ...] = ()  # YAML `in`, subset of text/audio/image
    output: tuple[str, ...] = ()  # YAML `out`
    tools: bool = False
    reranker: bool = False
    context: int = 0


@dataclass(frozen=True)
class ModelConfig:
    id: str
    cmd: tuple[str, ...]  # argv, split like a POSIX shell; never run through a shell
    cmd_text: str = ""  # the expanded command line (comment lines removed): what runs
    cmd_stop: tuple[str, ...] = ()  # argv; the literal `${PID}` is substituted at stop time
    # The same as written: macros expanded, `${env.NAME}` kept (the loader fills them when the file has any).
    cmd_written: str = ""
    cmd_stop_written: str = ""
    env_written: tuple[tuple[str, str], ...] = ()
    proxy: str = ""  # upstream base URL
    check_endpoint: str = "/health"  # "none" = ready as soon as spawned
    ttl: float = 0.0  # effective (after globalTTL); 0 = never unload
    unload_timeout: float = DEFAULT_UNLOAD_TIMEOUT  # effective graceful-stop seconds
    health_check_timeout: float = DEFAULT_HEALTH_CHECK_TIMEOUT  # effective, bounds a whole start
    aliases: tuple[str, ...] = ()  # declared aliases (setParamsByID auto-aliases are in Config.aliases)
    env: tuple[tuple[str, str], ...] = ()  # added to the parent environment, in order
    use_model_name: str = ""
    unlisted: bool = False
    name: str = ""
    description: str = ""
    concurrency_limit: int = DEFAULT_CONCURRENCY_LIMIT  # effective (0 in YAML means 10)
    filters: Filters = field(default_factory=Filters)
    metadata: Mapping[str, Any] = _no_entries()
    send_loading_state: bool = False  # effective (per-model override or the global value)
    prefetch: bool = True  # effective: read its files into the page cache while a swap to it drains
    timeouts: Timeouts = field(default_factory=Timeouts)
    ignore_websockets: bool = False  # YAML `compat.ignoreWebsockets`
    capabilities: Capabilities | None = None
    port: int | None = None  # the `${PORT}` assigned to this model, if its cmd used one
    vram: int | None = None  # llmswap: declared memory footprint in bytes (YAML `vram: 6.5GB`)
    gpus: tuple[int, ...] | None = None  # llmswap: pinned devices (YAML `gpus`, else CUDA_VISIBLE_DEVICES)
    persistent: bool = False  # llmswap: the vram router never evicts it (groups have their own flag)
    deadline_ms: float = 0.0  # llmswap: default X-Deadline-Ms of its requests (0 = none)
    kv_dir: Path | None = None  # llmswap: its `${KV_DIR}`, when cmd names it (created before each start)
    kv_cache: KvCacheSettings | None = None  # llmswap: YAML `kvCache: true`; slots saved and restored
    sleep_call: tuple[str, str] | None = None  # llmswap: YAML `sleep: "POST /sleep?level=1"` (method, path)
    wake_call: tuple[str, str] | None = None  # llmswap: YAML `wake: "POST /wake_up"`; both set or neither
    line: int = 0  # line of `models.<id>` in the config file, for messages

    # What is displayed of the commands (/running, logs, events, check-config): never an env value, and
    # secret-looking literals masked.
    @property
    def cmd_shown(self) -> str:
        """The command line as the user wrote it (/running, check-config)."""
        return mask_secrets(self.cmd_written or self.cmd_text)

    @property
    def argv_shown(self) -> str:
        """The argv that runs, quoted for a shell (log lines)."""
        try:
            argv = split_command(self.cmd_written) if self.cmd_written else self.cmd
        except ValueError:
            return self.cmd_shown
        return mask_secrets(shlex.join(argv))

    def cmd_stop_shown(self, pid: int) -> str:
        return mask_secrets((self.cmd_stop_written or " ".join(self.cmd_stop)).replace("${PID}", str(pid)))

    @property
    def env_shown(self) -> tuple[str, ...]:
        return tuple(mask_secrets(f"{key}={value}") for key, value in self.env_written or self.env)


@dataclass(frozen=True)
class PeerConfig:
    """`peers.<id>`: a remote OpenAI-compatible backend."""

    id: str
    proxy: str
    models: tuple[str, ...]
    api_key: str = ""
    filters: Filters = field(default_factory=Filters)
    timeouts: Timeouts = field(default_factory=lambda: Timeouts(response_header=60.0))
    discover: bool = False  # llmswap: another llmswap, followed on its /api/events (inference/placement.py)


SELECTOR_STRATEGIES = ("warm", "pin", "spillover")


@dataclass(frozen=True)
class SelectorConfig:
    """`selectors.<id>`: a virtual model id that picks one of its targets per request."""

    id: str
    strategy: str  # warm | pin | spillover
    targets: tuple[str, ...]  # as written: model ids, aliases, `<peer>/<model>` or bare peer model names
    spillover: int = 1  # YAML `settings.spillover`: requests a spillover target takes before the next
    name: str = ""
    description: str = ""
    unlisted: bool = False
    metadata: Mapping[str, Any] = _no_entries()
    line: int = 0


@dataclass(frozen=True)
class ProfileConfig:
    """`profiles.<id>`: named pins, switched at run time (`PUT /api/profiles/active`)."""

    id: str
    description: str = ""
    pins: Mapping[str, str] = _no_entries()  # requested name -> target; "" (YAML null or "") = disabled


@dataclass(frozen=True)
class GroupConfig:
    """A group of the group router (`routing.router.settings.groups.<id>`, legacy `groups.<id>`)."""

    id: str
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class MatrixConfig:
    """The matrix router's settings, already compiled (DSL parsed, vars resolved, `+ref`s ordered)."""

    vars: Mapping[str, str] = _no_entries()  # var -> real model id
    evict_costs: Mapping[str, int] = _no_entries()  # real model id -> cost (vars resolved); absent = 1
    sets: tuple[tuple[str, str], ...] = ()  # (set name, DSL text) in compiled order
    program: Any = None  # a llmswap.config.matrix_dsl.MatrixProgram


@dataclass(frozen=True)
class VramSettings:
    """`routing.router.settings` when `routing.router.use: vram`."""

    budget: int | None = None  # bytes; None = the devices' total memory minus reserve
    reserve: int = 512 * 1024 * 1024  # bytes (default 0.5GB)
    evict_costs: Mapping[str, float] = _no_entries()  # real model id -> cost; absent = its measured load time


@dataclass(frozen=True)
class RouterConfig:
    use: str = "group"  # group | matrix | vram
    groups: Mapping[str, GroupConfig] = _no_entries()  # always includes DEFAULT_GROUP_ID
    matrix: MatrixConfig | None = None
    vram: VramSettings = field(default_factory=VramSettings)


@dataclass(frozen=True)
class BatchSettings:
    """`routing.scheduler.settings.batch`."""

    max_wait: float = 30.0  # seconds a request may wait because of batching before its model goes next
    min_residency: float = 10.0  # seconds a freshly loaded model is protected from eviction unless idle
    priority: Mapping[str, int] = _no_entries()  # real model id -> priority


@dataclass(frozen=True)
class AdmissionConfig:
    """`routing.scheduler.admission`: bounds on waiting requests; applies to every scheduler."""

    max_queue: int = 0  # global bound on waiting requests, 0 = unbounded
    max_queue_per_model: int = 0  # per-model bound on waiting requests, 0 = unbounded
    policy: str = "reject"  # reject | shed-lowest
    queue_timeout: float = 0.0  # seconds; 0 = wait as long as it takes


PRIORITIZERS = ("fcfs", "edf", "lrs")  # routing.scheduler.settings.prioritizer
ON_DEADLINE = ("ignore", "reject")  # routing.scheduler.settings.onDeadline


@dataclass(frozen=True)
class SchedulerConfig:
    use: str = "fifo"  # fifo | batch
    priority: Mapping[str, int] = _no_entries()  # fifo.priority: real model id -> priority (higher first)
    batch: BatchSettings = field(default_factory=BatchSettings)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    prioritizer: str = "fcfs"  # settings.prioritizer: fcfs | edf | lrs, within a priority class
    on_deadline: str = "ignore"  # settings.onDeadline: ignore (count only) | reject (503 before serving)
    preempt_below: int | None = None  # settings.preemptBelow: in-flight work below it may be preempted


@dataclass(frozen=True)
class RoutingConfig:
    router: RouterConfig = field(default_factory=RouterConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


@dataclass(frozen=True)
class ApiKey:
    """An `apiKeys` entry: a plain string, or an object with `key`, `name`, `priority`, `maxConcurrent`."""

    key: str
    priority: int = 0
    max_concurrent: int = 0  # 0 = unlimited
    deadline_ms: float = 0.0  # default X-Deadline-Ms of its requests (0 = none; before the model's)
    name: str = ""  # who owns the files and batches this key creates; several keys may share a name

    @property
    def owner(self) -> str:
        """The name files and batches are scoped to: `name`, else a digest of the key (the key itself is
        never stored)."""
        return self.name or "key-" + hashlib.sha256(self.key.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class TaskTypeConfig:
    """`tasks.types.<name>`."""

    name: str
    model: str  # real model id
    vram: int | None = None  # bytes; None = the model's footprint under the vram router


@dataclass(frozen=True)
class KvCacheSettings:
    """`kvCache:` (llmswap.kvcache): where slot saves live, the bound on their total size, the client
    timeouts of one save and one restore."""

    dir: Path
    max_size: int = DEFAULT_KV_MAX_SIZE
    save_timeout: float = 30.0  # a save waits for a busy slot: this bounds the wait, then the stop goes on
    restore_timeout: float = 30.0
    save: str = "auto"  # "auto": a slot is saved only when that pays (llmswap.kvcache.rates); "always"


@dataclass(frozen=True)
class TasksConfig:
    """`tasks:`: the durable task queue (Peregrine adapter). `db` is a SQLite file, or a PostgreSQL URL
    (a str) that several hosts share; `host` names this one there (None: hostname:port)."""

    db: Path | str
    max_queue_depth: int = 500
    types: Mapping[str, TaskTypeConfig] = _no_entries()
    priority: int = -10  # tasks run below interactive requests by default
    max_preemptions: int = 3  # a task preempted more often than this is failed (tasks/preemption.py)
    host: str | None = None
    lease_seconds: float = 30.0  # a running task's claim lapses when its host stops renewing it this long


@dataclass(frozen=True)
class ActivityConfig:
    """`metricsMaxInMemory`, `captureBuffer` (MiB) and `store:` (llmswap.activity)."""

    max_in_memory: int = 1000
    capture_mb: float = 5.0  # 0 = captures off
    store_path: Path | None = None  # None: activity in memory only
    store_retention: int = 100_000  # rows the store keeps (0 = all); llmswap's addition


@dataclass(frozen=True)
class PerformanceConfig:
    """`performance:`: sampling of CPU, memory and GPUs."""

    disabled: bool = False
    every: float = 5.0  # seconds between samples


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    models: Mapping[str, ModelConfig] = _no_entries()
    aliases: Mapping[str, str] = _no_entries()  # alias (incl. setParamsByID auto-aliases) -> model id
    peers: Mapping[str, PeerConfig] = _no_entries()
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    health_check_timeout: float = DEFAULT_HEALTH_CHECK_TIMEOUT
    start_port: int = DEFAULT_START_PORT
    global_ttl: float = 0.0
    unload_timeout: float = DEFAULT_UNLOAD_TIMEOUT
    log_level: str = "info"
    log_to_stdout: str = "proxy"
    log_time_format: str = ""
    send_loading_state: bool = False
    prefetch: bool = True  # llmswap: YAML `prefetch`, the default of every model's own
    include_aliases_in_list: bool = False
    api_keys: tuple[ApiKey, ...] = ()
    preload: tuple[str, ...] = ()  # hooks.on_startup.preload, resolved to real model ids
    startup_profile: str | None = None  # hooks.on_startup.profile: active at start-up and after each reload
    upstream_ignore_paths: tuple[str, ...] = DEFAULT_UPSTREAM_IGNORE_PATHS  # regexes
    max_request_body: int = DEFAULT_MAX_REQUEST_BODY  # llmswap: YAML `maxRequestBodySize`
    client_header_timeout: float = DEFAULT_CLIENT_HEADER_TIMEOUT  # llmswap: YAML `clientHeaderTimeout`
    state_dir: Path | None = None  # llmswap: YAML `stateDir`, where learned footprints persist
    tasks: TasksConfig | None = None
    kv_cache: KvCacheSettings | None = None  # llmswap: YAML `kvCache:` (its defaults when not written)
    max_sleeping: int = DEFAULT_MAX_SLEEPING  # llmswap: YAML `maxSleeping`, models asleep at once (0 = never)
    # llmswap: YAML `cors.allowedOrigins` and `allowedHosts`, beyond loopback (llmswap.server.http.guard)
    allowed_origins: tuple[OriginPattern, ...] = ()
    allowed_hosts: tuple[HostPattern, ...] = ()
    selectors: Mapping[str, SelectorConfig] = _no_entries()
    profiles: Mapping[str, ProfileConfig] = _no_entries()
    activity: ActivityConfig = field(default_factory=ActivityConfig)
    performance: PerformanceConfig = field(default_factory=PerformanceConfig)
    warnings: tuple[str, ...] = ()  # unknown keys and silent adjustments, each naming file:line

    def real_model_name(self, name: str) -> str | None:
        """The model id a requested name refers to (an id first, then an alias), or None."""
        if name in self.models:
            return name
        return self.aliases.get(name)
