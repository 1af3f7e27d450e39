"""Every key the configuration accepts, section by section: its name, the type of its value, its default and
what it does. The loader takes its lists of known keys from here (a key missing here is reported as unknown
when written), and `llmswap schema` writes the JSON Schema editors check a config.yaml against from the same
definitions (`schema.py`), so the two cannot drift apart.

A `Section` is the keys of one mapping; it is a collection of their names, which is what the loader's
`warn_unknown` takes. A key's `value` is a JSON Schema fragment; `section` (a nested mapping) and `entries`
(a mapping of names the user chooses, each a `Section`: models, peers...) nest them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmswap.config.model import (
    DEFAULT_HEALTH_CHECK_TIMEOUT,
    DEFAULT_START_PORT,
    DEFAULT_UNLOAD_TIMEOUT,
    BatchSettings,
)

NO_DEFAULT = object()

# Every scalar may be a macro (`${name}`), expanded before its type is read, or null (the default).
_MACRO: dict[str, Any] = {"type": "string", "pattern": r"\$\{"}
_NULL: dict[str, Any] = {"type": "null"}


def _scalar(kind: str, **more: Any) -> dict[str, Any]:
    return {"anyOf": [{"type": kind, **more}, _MACRO, _NULL]}


STR: dict[str, Any] = {"type": ["string", "null"]}
BOOL = _scalar("boolean")
NUMBER = _scalar("number")
INTEGER = _scalar("integer")
SIZE: dict[str, Any] = {"type": ["number", "string", "null"]}  # 6.5GB, 512MiB, or a number
DURATION: dict[str, Any] = {"type": ["number", "string", "null"]}  # seconds, or 5s / 2m
STR_LIST: dict[str, Any] = {"type": ["array", "null"], "items": {"type": "string"}}
NAMES: dict[str, Any] = {"anyOf": [STR_LIST, {"type": "string"}]}  # a list, or one name
ANY_MAP: dict[str, Any] = {"type": ["object", "null"]}
NUMBER_MAP: dict[str, Any] = {"type": ["object", "null"], "additionalProperties": NUMBER}


def choice(*values: str) -> dict[str, Any]:
    return {"anyOf": [{"enum": list(values)}, _MACRO, _NULL]}


@dataclass(frozen=True)
class Key:
    name: str
    about: str  # one line: what it does
    value: dict[str, Any] = field(default_factory=dict)  # its JSON Schema (a scalar or a list)
    default: Any = NO_DEFAULT
    section: Section | None = None  # a mapping of known keys
    entries: Section | None = None  # a mapping of names the user chooses, each of these keys
    llmswap: bool = False  # an llmswap addition (not in llama-swap)


class Section:
    """The keys of one mapping of the config (a collection of their names), and the keys it ignores."""

    def __init__(self, title: str, *keys: Key, ignored: tuple[str, ...] = (), lenient: bool = False) -> None:
        self.title = title
        self.keys = keys
        self.ignored = ignored
        self.lenient = lenient  # other keys are accepted silently (as llama-swap does here)
        self._names = {key.name: key for key in keys}

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __getitem__(self, name: str) -> Key:
        return self._names[name]

    @property
    def by_name(self) -> Mapping[str, Key]:
        return self._names


TIMEOUTS = Section(
    "timeouts of the calls to an upstream (seconds, 0 = no limit)",
    Key("connect", "connecting to the upstream", NUMBER, 0),
    Key("keepalive", "TCP keep-alive probes of an open connection", NUMBER, 0),
    Key("responseHeader", "from sending the request to the answer's headers", NUMBER, 0),
    Key("tlsHandshake", "the TLS handshake with an https upstream", NUMBER, 0),
    Key("expectContinue", "waiting for 100 Continue", NUMBER, 0),
    Key("idleConn", "how long a kept-alive connection waits in the pool", NUMBER, 0),
    Key("wall", "the whole answer, from request to its end (llmswap's watchdog)", NUMBER, 0, llmswap=True),
    Key("idle", "silence in the middle of an answer (llmswap's watchdog)", NUMBER, 0, llmswap=True),
)

FILTERS = Section(
    "request rewriting on the way to the upstream",
    Key("stripParams", "request fields removed, comma separated (never model)", STR, ""),
    Key("strip_params", "llama-swap's former spelling of stripParams", STR, ""),
    Key("setParams", "request fields set, overriding the client's", ANY_MAP),
    Key("setParamsByID", "fields set when the client used this name (an alias or `${MODEL_ID}:variant`)",
        ANY_MAP),
)

CAPABILITIES = Section(
    "what the model can do, as /v1/models reports it",
    Key("in", "input kinds: text, image, audio", STR_LIST),
    Key("out", "output kinds: text, image, audio", STR_LIST),
    Key("tools", "whether it calls tools", BOOL, False),
    Key("reranker", "whether it ranks documents", BOOL, False),
    Key("context", "its context length in tokens (also guards requests that would not fit)", INTEGER, 0),
    lenient=True,
)

COMPAT = Section("compatibility switches",
                 Key("ignoreWebsockets", "an open websocket does not hold the model loaded", BOOL, False))

MODEL = Section(
    "one model: how to start its server and how to reach it",
    Key("cmd", "the command line that starts the model's server (${PORT} is its port)", STR),
    Key("cmdStop", "a command that stops it instead of a signal (${PID} is its pid)", STR, ""),
    Key("proxy", "the URL the server answers at", STR, "http://localhost:${PORT}"),
    Key("checkEndpoint", "the path that answers 200 once it is ready; none: no check", STR, "/health"),
    Key("ttl", "seconds idle before it is stopped (-1: globalTTL, 0: never)", NUMBER, -1),
    Key("unloadTimeout", "seconds its server gets to stop before it is killed (0: the global one)", NUMBER,
        0),
    Key("healthCheckTimeout", "seconds it may take to start (default: the global one)", NUMBER),
    Key("aliases", "other names clients may ask it by (a name, or newer llama-swap's {id, name, unlisted})",
        {"type": ["array", "null"], "items": {"anyOf": [{"type": "string"}, {
            "type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}]}}),
    Key("env", "KEY=value strings added to its environment", STR_LIST),
    Key("useModelName", "the model name sent to the upstream instead of the client's", STR, ""),
    Key("unlisted", "left out of /v1/models", BOOL, False),
    Key("name", "a display name for /v1/models", STR, ""),
    Key("description", "a description for /v1/models", STR, ""),
    Key("concurrencyLimit", "requests served at once before 429 (0: 10)", INTEGER, 0),
    Key("filters", "request rewriting", section=FILTERS),
    Key("macros", "macros of this model alone", ANY_MAP),
    Key("metadata", "anything, shown in /v1/models under meta.llamaswap", ANY_MAP),
    Key("sendLoadingState", "stream its load's progress to a waiting streaming client", BOOL),
    Key("timeouts", "timeouts of the calls to it", section=TIMEOUTS),
    Key("compat", "compatibility switches", section=COMPAT),
    Key("capabilities", "what it can do", section=CAPABILITIES),
    Key("vram", "the memory it takes (6.5GB, 512MiB; vram router; measured when not given)", SIZE,
        llmswap=True),
    Key("gpus", "the device indexes it runs on (vram router)", {"type": ["array", "null"],
                                                                 "items": {"type": "integer"}}, llmswap=True),
    Key("persistent", "never evicted by the vram router", BOOL, False, llmswap=True),
    Key("deadlineMs", "its requests' deadline, ms after arrival, when none is given (0: none)", NUMBER, 0,
        llmswap=True),
    Key("kvCache", "save its llama-server slots before a stop, restore them after a start", BOOL, False,
        llmswap=True),
    Key("sleep", "a call (METHOD PATH) that frees its GPU memory without exiting (vLLM's sleep mode)", STR,
        llmswap=True),
    Key("wake", "the call that takes the memory back (both or neither)", STR, llmswap=True),
    Key("prefetch", "read its files into the page cache while a swap to it drains (default: prefetch)",
        BOOL, llmswap=True),
)

GROUP = Section(
    "a group of models (llama-swap's groups)",
    Key("swap", "one member at a time (true) or all together (false)", BOOL, True),
    Key("exclusive", "starting a member stops the other groups' models", BOOL, True),
    Key("persistent", "other groups never stop this one's models", BOOL, False),
    Key("members", "the model ids in the group", STR_LIST),
)

MATRIX = Section(
    "llama-swap's matrix: which models may run together",
    Key("vars", "short names for models", ANY_MAP),
    Key("sets", "named expressions of models that may run together", ANY_MAP),
    Key("evict_costs", "the cost of evicting each model (by short name)", NUMBER_MAP),
)

ROUTER_SETTINGS = Section(
    "the router's settings",
    Key("groups", "the group router's groups", entries=GROUP),
    Key("matrix", "the matrix router's matrix", section=MATRIX),
    Key("budget", "the vram router's memory budget (a size, or per device)", {"type": ["number", "string",
                                                                                      "object", "null"]},
        llmswap=True),
    Key("reserve", "memory the vram router leaves free", {"type": ["number", "string", "object", "null"]},
        llmswap=True),
    Key("evict_costs", "what reloading each model costs (vram router; default: its load time)", NUMBER_MAP,
        llmswap=True),
)

ROUTER = Section(
    "which router decides what runs together",
    Key("use", "group, matrix or vram", choice("group", "matrix", "vram"), "group"),
    Key("settings", "the router's settings", section=ROUTER_SETTINGS),
)

FIFO = Section("the fifo scheduler's settings",
               Key("priority", "a priority per model (higher first)", NUMBER_MAP))

BATCH = Section(
    "the batch scheduler's settings",
    Key("maxWait", "seconds any request may wait for its model's turn", NUMBER, BatchSettings.max_wait),
    Key("minResidency", "seconds a loaded model stays before it may be swapped out (unless idle)", NUMBER,
        BatchSettings.min_residency),
    Key("priority", "a priority per model (higher first)", NUMBER_MAP),
)

SCHEDULER_SETTINGS = Section(
    "the scheduler's settings",
    Key("fifo", "the fifo scheduler's", section=FIFO),
    Key("batch", "the batch scheduler's", section=BATCH),
    Key("prioritizer", "order within a priority: fcfs, edf or lrs", choice("fcfs", "edf", "lrs"), "fcfs"),
    Key("onDeadline", "a request past its deadline: ignore, reject or fail",
        choice("ignore", "reject", "fail"), "ignore"),
    Key("preemptBelow", "requests below this priority may be preempted for higher ones", INTEGER),
)

ADMISSION = Section(
    "bounds on waiting requests",
    Key("maxQueue", "requests waiting at most, all models (0: no bound)", INTEGER, 0),
    Key("maxQueuePerModel", "requests waiting at most per model (0: no bound)", INTEGER, 0),
    Key("policy", "when full: reject the newcomer, or shed-lowest priority", choice("reject", "shed-lowest"),
        "reject"),
    Key("queueTimeout", "seconds a request may wait before 503 (0: no bound)", NUMBER, 0),
)

SCHEDULER = Section(
    "which scheduler orders the requests",
    Key("use", "fifo or batch", choice("fifo", "batch"), "fifo"),
    Key("settings", "the scheduler's settings", section=SCHEDULER_SETTINGS),
    Key("admission", "bounds on waiting requests", section=ADMISSION),
)

ROUTING = Section(
    "the router and the scheduler (llmswap's place for groups and matrix)",
    Key("router", "which router decides what runs together", section=ROUTER),
    Key("scheduler", "which scheduler orders the requests", section=SCHEDULER),
)

API_KEY = Section(
    "one API key with its settings",
    Key("key", "the key clients send (Authorization: Bearer, or x-api-key)", STR),
    Key("name", "a name for logs and activity", STR, ""),
    Key("priority", "the priority of its requests", INTEGER, 0, llmswap=True),
    Key("maxConcurrent", "its requests served at once (0: no limit)", INTEGER, 0, llmswap=True),
    Key("deadlineMs", "its requests' deadline, ms after arrival (0: none)", NUMBER, 0, llmswap=True),
)

ON_STARTUP = Section(
    "what happens at startup",
    Key("preload", "models loaded right after startup, in order", STR_LIST),
    Key("profile", "the profile active from startup and after every reload", STR, llmswap=True),
)

HOOKS = Section("hooks", Key("on_startup", "what happens at startup", section=ON_STARTUP))

UPSTREAM = Section(
    "the /upstream routes",
    Key("ignorePaths", "regular expressions of paths that do not keep a model loaded", STR_LIST),
)

PEER = Section(
    "another backend (an API, or another llmswap)",
    Key("proxy", "its base URL", STR),
    Key("apiKey", "the key sent to it", STR, ""),
    Key("models", "the models it serves, addressed as <peer>/<model>", STR_LIST),
    Key("filters", "request rewriting on the way to it", section=FILTERS),
    Key("timeouts", "timeouts of the calls to it", section=TIMEOUTS),
    Key("discover", "another llmswap: follow its state, place requests by it", BOOL, False, llmswap=True),
    ignored=("tailcatKey",),
)

SPILLOVER = Section(
    "the selector's strategy settings",
    Key("spillover", "requests in flight on a target before the next one takes over", INTEGER),
)

SELECTOR = Section(
    "a virtual model name that picks a real one",
    Key("strategy", "how the target is picked: pin, spillover, ...", STR),
    Key("targets", "the models (or peer models) it picks from, in order", STR_LIST),
    Key("settings", "the strategy's settings", section=SPILLOVER),
    Key("name", "a display name", STR, ""),
    Key("description", "a description", STR, ""),
    Key("unlisted", "left out of /v1/models", BOOL, False),
    Key("metadata", "anything, shown in /v1/models", ANY_MAP),
)

PROFILE = Section(
    "a named set of pins (PUT /api/profiles/active)",
    Key("description", "what it is for", STR, ""),
    Key("pins", "name -> the model it answers with (null: disabled)", ANY_MAP),
)

CORS = Section(
    "browser origins",
    Key("allowedOrigins", "web pages (origins, with * wildcards) allowed to call llmswap", STR_LIST,
        llmswap=True),
)

STORE = Section(
    "where activity is kept across restarts",
    Key("path", "the SQLite file of the activity store", STR),
    Key("retention", "rows kept", INTEGER),
)

PERFORMANCE = Section(
    "the machine's readings for the status page",
    Key("disabled", "no readings", BOOL, False),
    Key("every", "seconds between readings (5s)", DURATION, "5s"),
)

KV_CACHE = Section(
    "llama-server slot saves kept across swaps",
    Key("dir", "the folder of the saves, one folder per model (default: <stateDir>/kv)", STR),
    Key("maxSize", "their total size on disk; the least recently used go first", SIZE, "20GiB"),
    Key("saveTimeout", "seconds one save may take before the stop goes on", NUMBER, 30),
    Key("restoreTimeout", "seconds one restore may take before the start goes on", NUMBER, 30),
    Key("save", "auto: save a slot only when that pays for itself; always: every slot",
        choice("auto", "always"), "auto"),
)

TASK_TYPE = Section(
    "one type of background task",
    Key("model", "the model that runs it", STR),
    Key("vram", "the memory one task of it needs (batching)", SIZE),
)

TASKS = Section(
    "the durable queue of background tasks",
    Key("db", "a SQLite file, or a postgresql:// URL for a queue shared by several hosts", STR,
        "./llmswap-tasks.sqlite"),
    Key("maxQueueDepth", "tasks queued at most per type", INTEGER),
    Key("types", "the task types and their models", entries=TASK_TYPE),
    Key("priority", "the priority of task requests against interactive ones", INTEGER),
    Key("maxPreemptions", "times a task may be preempted (or lose its host) before it fails", INTEGER),
    Key("host", "this host's name in a shared queue (default: hostname:port)", STR),
    Key("leaseSeconds", "seconds a running task stays claimed without its host's heartbeat", NUMBER, 30),
)

ROOT = Section(
    "llmswap's configuration (llama-swap's format, and llmswap's additions)",
    Key("healthCheckTimeout", "seconds a model may take to start (at least 15)", NUMBER,
        DEFAULT_HEALTH_CHECK_TIMEOUT),
    Key("logLevel", "debug, info, warn or error", choice("debug", "info", "warn", "warning", "error"),
        "info"),
    Key("logTimeFormat", "timestamps of log lines (empty: none; rfc3339, ...)", STR, ""),
    Key("logToStdout", "what goes to stdout: proxy, upstream, both or none",
        choice("proxy", "upstream", "both", "none"), "proxy"),
    Key("startPort", "the first ${PORT} given to a model", INTEGER, DEFAULT_START_PORT),
    Key("sendLoadingState", "stream a load's progress to waiting streaming clients", BOOL, False),
    Key("includeAliasesInList", "list aliases in /v1/models too", BOOL, False),
    Key("globalTTL", "seconds idle before a model is stopped (0: never)", NUMBER, 0),
    Key("unloadTimeout", "seconds a model's server gets to stop before it is killed", NUMBER,
        DEFAULT_UNLOAD_TIMEOUT),
    Key("macros", "names replaced in the models' settings (${name})", ANY_MAP),
    Key("models", "the models, by id", entries=MODEL),
    Key("apiKeys", "keys clients must send (none: no key needed)",
        {"type": ["array", "null"], "items": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/apiKey"}]}}),
    Key("hooks", "hooks", section=HOOKS),
    Key("peers", "other backends, by id", entries=PEER),
    Key("routing", "the router and the scheduler", section=ROUTING),
    Key("groups", "llama-swap's groups (same as routing.router.settings.groups)", entries=GROUP),
    Key("matrix", "llama-swap's matrix (same as routing.router.settings.matrix)", section=MATRIX),
    Key("upstream", "the /upstream routes", section=UPSTREAM),
    Key("maxRequestBodySize", "the largest request body (bytes, or a size such as 32MiB)", SIZE, "32MiB",
        llmswap=True),
    Key("clientHeaderTimeout", "seconds a connection has to send a request's head", NUMBER, 60, llmswap=True),
    Key("stateDir", "where state is kept (default: $LLMSWAP_STATE_DIR, else .llmswap-state beside the file)",
        STR, llmswap=True),
    Key("tasks", "the durable queue of background tasks", section=TASKS, llmswap=True),
    Key("cors", "browser origins", section=CORS, llmswap=True),
    Key("allowedHosts", "Host header names accepted beyond loopback", STR_LIST, llmswap=True),
    Key("selectors", "virtual model names that pick a real one", entries=SELECTOR),
    Key("profiles", "named sets of pins", entries=PROFILE),
    Key("metricsMaxInMemory", "activity rows kept in memory", INTEGER, 1000),
    Key("captureBuffer", "megabytes of request and answer captures kept", NUMBER, 5),
    Key("store", "where activity is kept across restarts", section=STORE, llmswap=True),
    Key("performance", "the machine's readings for the status page", section=PERFORMANCE),
    Key("kvCache", "llama-server slot saves kept across swaps", section=KV_CACHE, llmswap=True),
    Key("maxSleeping", "models asleep at once (0: never sleep, always stop)", INTEGER, 2, llmswap=True),
    Key("prefetch", "read a model's files into the page cache while a swap to it drains", BOOL, True,
        llmswap=True),
    ignored=("ui", "logRequests"),
)
