"""Top-level settings, apiKeys, hooks, peers, upstream, llmswap's additions and unknown keys."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from llmswap.config import ApiKey, Config, Filters, TaskTypeConfig, Timeouts, format_config
from llmswap.config.model import KvCacheSettings

from .support import errors_of, load, one_error

MODELS = """\
models:
  a: {cmd: "srv --port ${PORT}", aliases: [alpha]}
  b: {cmd: "srv --port ${PORT}"}
"""


def test_top_level_defaults() -> None:
    config = load("")
    assert config == Config(
        path=Path("config.yaml"),
        models=config.models,
        aliases=config.aliases,
        peers=config.peers,
        routing=config.routing,
        state_dir=Path.cwd() / ".llmswap-state",
        kv_cache=KvCacheSettings(dir=Path.cwd() / ".llmswap-state" / "kv", max_size=20 * 1024**3),
    )
    assert (config.health_check_timeout, config.start_port, config.global_ttl, config.unload_timeout) == (
        120,
        5800,
        0,
        10,
    )
    assert (config.log_level, config.log_to_stdout, config.log_time_format) == ("info", "proxy", "")
    assert config.max_request_body == 32 * 1024**2
    assert config.upstream_ignore_paths == (r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$",)
    assert config.tasks is None
    assert config.warnings == ()


def test_top_level_values() -> None:
    config = load("""\
        healthCheckTimeout: 60
        startPort: 7000
        globalTTL: 300
        unloadTimeout: 0
        logLevel: WARNING
        logToStdout: both
        logTimeFormat: RFC3339
        sendLoadingState: true
        includeAliasesInList: true
        maxRequestBodySize: 1GiB
        stateDir: /var/lib/llmswap
        """)
    assert (config.health_check_timeout, config.start_port, config.global_ttl) == (60, 7000, 300)
    assert config.unload_timeout == 10  # 0 means the default
    assert (config.log_level, config.log_to_stdout, config.log_time_format) == ("warn", "both", "rfc3339")
    assert config.send_loading_state is True
    assert config.include_aliases_in_list is True
    assert config.max_request_body == 1024**3
    assert config.state_dir == Path("/var/lib/llmswap")


def test_relative_state_dir_is_beside_the_config_file() -> None:
    config = load("stateDir: state\n", path="/etc/llmswap/config.yaml")
    assert config.state_dir == Path("/etc/llmswap/state")
    assert load("", path="/etc/llmswap/config.yaml").state_dir == Path("/etc/llmswap/.llmswap-state")


def test_llmswap_state_dir_in_the_environment_is_the_default_state_dir(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSWAP_STATE_DIR", "/var/lib/llmswap")  # as the service unit and the image set it
    config = load("", path="/etc/llmswap/config.yaml")
    assert config.state_dir == Path("/var/lib/llmswap") and config.kv_cache.dir == Path("/var/lib/llmswap/kv")
    assert load("stateDir: mine\n", path="/etc/llmswap/config.yaml").state_dir == Path("/etc/llmswap/mine")


def test_max_request_body_bare_number_is_bytes() -> None:
    assert load("maxRequestBodySize: 1048576\n").max_request_body == 1048576
    assert one_error("maxRequestBodySize: 0\n") == (
        "config.yaml:1: maxRequestBodySize: must be a positive size such as 32MiB"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "startPort: 0\n",
            "config.yaml:1: startPort: startPort must be greater than 1 (a port from 1 to 65535), got 0",
        ),
        ("startPort: http\n", 'config.yaml:1: startPort: must be a port number, got "http"'),
        (
            "globalTTL: -1\n",
            "config.yaml:1: globalTTL: must be >= 0, got -1; accepted: 0 (never unload) or seconds",
        ),
        ("unloadTimeout: -2\n", "config.yaml:1: unloadTimeout: must be >= 0, got -2"),
        (
            "healthCheckTimeout: []\n",
            "config.yaml:1: healthCheckTimeout: must be a number of seconds, got a list",
        ),
        (
            "logToStdout: all\n",
            "config.yaml:1: logToStdout: logToStdout must be one of: proxy, upstream, both, none; got 'all'",
        ),
        ("sendLoadingState: 2\n", "config.yaml:1: sendLoadingState: must be true or false, got 2"),
    ],
)
def test_top_level_validation(text: str, expected: str) -> None:
    assert one_error(text) == expected


def test_unknown_log_level_and_time_format_warn() -> None:
    config = load("logLevel: chatty\nlogTimeFormat: iso\n")
    assert (config.log_level, config.log_time_format) == ("info", "")
    assert config.warnings == (
        "config.yaml:1: logLevel: unknown level 'chatty', using info (valid: debug, info, warn, error)",
        "config.yaml:2: logTimeFormat: unknown format 'iso', timestamps disabled (valid: rfc3339, kitchen, "
        "...)",
    )


def test_api_keys_strings_and_objects() -> None:
    config = load("""\
        apiKeys:
          - sk-plain
          - key: sk-batch
            priority: -5
            maxConcurrent: 2
          - {key: sk-vip, priority: 10, name: vip}
        """)
    assert config.api_keys == (
        ApiKey("sk-plain"),
        ApiKey("sk-batch", priority=-5, max_concurrent=2),
        ApiKey("sk-vip", priority=10, name="vip"),
    )
    assert config.api_keys[2].owner == "vip" and "sk-plain" not in config.api_keys[0].owner


def test_api_key_errors() -> None:
    errors = errors_of("""\
        apiKeys:
          - ""
          - "sk with space"
          - {priority: 1}
          - [nested]
          - {key: sk-x, maxConcurrent: -1}
        """)
    assert errors == [
        "config.yaml:2: apiKeys[0]: empty api key found in apiKeys; give a key or remove the entry",
        "config.yaml:3: apiKeys[1]: api key cannot contain spaces; check for a stray space or line break",
        "config.yaml:4: apiKeys[2]: empty api key found in apiKeys; give a key or remove the entry",
        "config.yaml:5: apiKeys[3]: must be a key or a mapping with key:, got a list",
        "config.yaml:6: apiKeys[4].maxConcurrent: must be >= 0, got -1",
    ]


def test_duplicate_api_key_warns() -> None:
    config = load("apiKeys: [sk-a, sk-a]\n")
    assert config.api_keys == (ApiKey("sk-a"),)
    assert config.warnings == (
        "config.yaml:1: apiKeys[1]: this key is listed twice; the first entry is used",
    )


def test_preload_trims_resolves_aliases_and_warns_on_unknown() -> None:
    config = load(MODELS + "hooks:\n  on_startup:\n    preload: [' alpha ', b, '', ghost]\n")
    assert config.preload == ("a", "b")
    assert config.warnings == (
        'config.yaml:6: hooks.on_startup.preload[3]: unknown model "ghost" is not preloaded',
    )


def test_peers() -> None:
    config = load(
        MODELS
        + """\
peers:
  router:
    proxy: https://openrouter.ai/api
    apiKey: sk-or
    models: [meta/llama, qwen/qwen3, meta/llama]
    filters:
      stripParams: top_k
      setParams: {provider: {zdr: true}, model: nope}
  box:
    proxy: http://10.0.0.2:8080
    models: [m1]
    timeouts: {responseHeader: 0, connect: 5}
"""
    )
    router = config.peers["router"]
    assert router.proxy == "https://openrouter.ai/api"
    assert router.api_key == "sk-or"
    assert router.models == ("meta/llama", "qwen/qwen3")
    assert router.filters == Filters(strip_params=("top_k",), set_params={"provider": {"zdr": True}})
    assert router.timeouts == Timeouts(response_header=60)
    assert config.peers["box"].timeouts == Timeouts(response_header=0, connect=5)


def test_peer_errors() -> None:
    errors = errors_of(
        MODELS
        + """\
peers:
  noproxy:
    models: [x]
  nomodels:
    proxy: http://h:1
  emptymodels:
    proxy: http://h:1
    models: []
  badproxy:
    proxy: ftp://h
    models: [x]
  notamap: http://h
"""
    )
    assert errors == [
        "config.yaml:5: peers.noproxy: proxy is required: the peer's base URL, e.g. https://openrouter.ai/api",
        "config.yaml:7: peers.nomodels: peer models can not be empty; list the model names the peer serves",
        "config.yaml:11: peers.emptymodels.models: peer models can not be empty; list the model names the "
        "peer serves",
        "config.yaml:13: peers.badproxy.proxy: invalid peer proxy URL 'ftp://h'; give an http:// or "
        "https:// base URL",
        "config.yaml:15: peers.notamap: must be a mapping with proxy:, models:, apiKey:, filters:, "
        "timeouts:, "
        'got "http://h"',
    ]


def test_peer_fully_qualified_names_must_not_collide() -> None:
    errors = errors_of("""\
        models:
          "p/x": {cmd: "srv --port ${PORT}"}
          m: {cmd: "srv --port ${PORT}", aliases: ["p/y"]}
        peers:
          p:
            proxy: http://h:1
            models: [x, y]
          "p/z":
            proxy: http://h:2
            models: [w]
          p2:
            proxy: http://h:3
            models: ["z/w"]
        """)
    assert errors == [
        'config.yaml:7: peers.p.models[0]: model ID "p/x" conflicts with fully qualified peer model name; '
        "rename one",
        'config.yaml:7: peers.p.models[1]: model m alias "p/y" conflicts with fully qualified peer model '
        'name; '
        "rename one",
    ]
    error = one_error("""\
        peers:
          "a/b":
            proxy: http://h:1
            models: [c]
          a:
            proxy: http://h:2
            models: ["b/c"]
        """)
    assert error == (
        'config.yaml:7: peers.a.models[0]: peer model name "a/b/c" is ambiguous between peers.a/b model "c" '
        'and peers.a model "b/c"'
    )


def test_upstream_ignore_paths() -> None:
    config = load("upstream:\n  ignorePaths: ['^/static/', '\\.map$']\n")
    assert config.upstream_ignore_paths == ("^/static/", r"\.map$")
    assert load("upstream:\n  ignorePaths: []\n").upstream_ignore_paths == (
        r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$",
    )
    error = one_error("upstream:\n  ignorePaths:\n    - '(['\n")
    assert error == (
        "config.yaml:3: upstream.ignorePaths[0]: invalid regular expression '([': "
        "unterminated character set at position 1"
    )


def test_tasks_section() -> None:
    config = load(
        MODELS
        + """\
tasks:
  db: data/tasks.sqlite
  maxQueueDepth: 50
  priority: -3
  maxPreemptions: 0
  types:
    embed: {model: alpha}
    summarize:
      model: b
      vram: 7GB
""",
        path="/srv/llmswap/config.yaml",
    )
    tasks = config.tasks
    assert tasks is not None
    assert tasks.db == Path("/srv/llmswap/data/tasks.sqlite")
    assert (tasks.max_queue_depth, tasks.priority, tasks.max_preemptions) == (50, -3, 0)
    assert dict(tasks.types) == {
        "embed": TaskTypeConfig("embed", "a"),
        "summarize": TaskTypeConfig("summarize", "b", vram=7 * 10**9),
    }
    # Memory is budgeted once, by the router, from the model's footprint: a type's own vram is not used.
    assert config.warnings == (
        "/srv/llmswap/config.yaml:13: tasks.types.summarize.vram: not used: the router budgets the memory "
        "of the model itself (its footprint); declare it as models.b.vram instead",
    )


def test_tasks_max_preemptions_shows_in_the_resolved_config() -> None:
    config = load("tasks:\n  maxPreemptions: 5\n", path="/srv/llmswap/config.yaml")
    assert yaml.safe_load(format_config(config))["tasks"]["maxPreemptions"] == 5


def test_tasks_defaults() -> None:
    tasks = load("tasks:\n", path="/srv/llmswap/config.yaml").tasks
    assert tasks is not None
    assert tasks.db == Path("/srv/llmswap/llmswap-tasks.sqlite")
    assert (tasks.max_queue_depth, tasks.priority, dict(tasks.types)) == (500, -10, {})
    assert tasks.max_preemptions == 3
    assert load("tasks:\n  db: /abs/q.db\n").tasks.db == Path("/abs/q.db")  # type: ignore[union-attr]


def test_tasks_errors() -> None:
    errors = errors_of(
        MODELS
        + """\
tasks:
  maxQueueDepth: 0
  maxPreemptions: -1
  types:
    ghost: {model: nope}
    nomodel: {vram: 1GB}
    wrong: [a]
"""
    )
    assert errors == [
        "config.yaml:5: tasks.maxQueueDepth: must be >= 1, got 0",
        "config.yaml:6: tasks.maxPreemptions: must be >= 0, got -1",
        'config.yaml:8: tasks.types.ghost.model: unknown model "nope"; use a model id or alias from models:',
        "config.yaml:9: tasks.types.nomodel: model is required: the model id or alias that runs this task "
        "type",
        "config.yaml:10: tasks.types.wrong: must be a mapping with model: and vram:, got a list",
    ]


def test_out_of_scope_llama_swap_keys_are_silent_and_unknown_keys_warn() -> None:
    config = load("""\
        metricsMaxInMemory: 1000
        captureBuffer: 5
        store: {path: x}
        ui: {activity: {}}
        performance: {every: 5s}
        logRequests: true
        globalTtl: 5
        wat: 1
        """)
    assert config.warnings == (
        "config.yaml:7: globalTtl: unknown key, ignored; did you mean 'globalTTL'?",
        "config.yaml:8: wat: unknown key, ignored",
    )


def test_unknown_macro_in_an_ignored_section_is_not_an_error() -> None:
    assert load("ui:\n  p: ['${nothing}']\n").warnings == ()


def test_client_header_timeout_is_positive_seconds() -> None:
    assert load("").client_header_timeout == 60
    assert load("clientHeaderTimeout: 2.5\n").client_header_timeout == 2.5
    assert one_error("clientHeaderTimeout: 0\n") == (
        "config.yaml:1: clientHeaderTimeout: must be a positive number of seconds (how long a client may "
        "take to send a request's headers), got 0"
    )
    assert one_error("clientHeaderTimeout: soon\n") == (
        'config.yaml:1: clientHeaderTimeout: must be a number of seconds, got "soon"'
    )


def test_tasks_on_postgresql_keep_the_url_and_hide_its_password() -> None:
    config = load("tasks:\n  db: postgresql://llmswap:s3cret@10.0.0.9:5432/queue\n  host: box1\n"
                  "  leaseSeconds: 12\n", path="/srv/llmswap/config.yaml")
    tasks = config.tasks
    assert tasks is not None
    assert (tasks.db, tasks.host, tasks.lease_seconds) == (
        "postgresql://llmswap:s3cret@10.0.0.9:5432/queue", "box1", 12.0)
    shown = yaml.safe_load(format_config(config))["tasks"]
    assert shown["db"] == "postgresql://llmswap:***@10.0.0.9:5432/queue"
    assert (shown["host"], shown["leaseSeconds"]) == ("box1", 12)


def test_tasks_host_without_a_shared_queue_and_a_short_lease_are_flagged() -> None:
    config = load("tasks:\n  host: box1\n", path="/srv/llmswap/config.yaml")
    assert config.warnings == (
        "/srv/llmswap/config.yaml:2: tasks.host: not used: a host name matters only in a queue several "
        "hosts share (tasks.db: postgresql://...)",
    )
    assert errors_of("tasks:\n  leaseSeconds: 0.5\n") == [
        "config.yaml:2: tasks.leaseSeconds: must be >= 1, got 0.5"]


def test_a_postgresql_url_without_its_driver_is_an_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the extra were not installed
    assert errors_of("tasks:\n  db: postgresql://llmswap@db/queue\n") == [
        "config.yaml:2: tasks.db: a PostgreSQL URL needs the psycopg driver, and psycopg is not installed: "
        "pip install 'llmswap-proxy[postgres]'"]
