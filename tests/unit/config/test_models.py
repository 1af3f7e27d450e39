"""`models.<id>`: every key, its default and its validation."""

from __future__ import annotations

import pytest

from llmswap.config import Capabilities, Filters, Timeouts
from llmswap.config.fields import closest

from .support import errors_of, load, one_error

BASE = "    cmd: srv --port ${PORT}\n"


def model(extra: str = "", *, globals_: str = "") -> str:
    """A config with one model `m` whose settings are BASE plus `extra` (lines indented by 4)."""
    return f"{globals_}models:\n  m:\n{BASE}{extra}"


def test_defaults_of_a_minimal_model() -> None:
    m = load(model()).models["m"]
    assert m.cmd == ("srv", "--port", "5800")
    assert m.cmd_text == "srv --port 5800"
    assert m.cmd_stop == ()
    assert m.proxy == "http://localhost:5800"
    assert m.check_endpoint == "/health"
    assert (m.ttl, m.unload_timeout, m.health_check_timeout) == (0, 10, 120)
    assert m.aliases == () and m.env == ()
    assert (m.use_model_name, m.unlisted, m.name, m.description) == ("", False, "", "")
    assert m.concurrency_limit == 10
    assert m.filters == Filters()
    assert dict(m.metadata) == {}
    assert m.send_loading_state is False
    assert m.timeouts == Timeouts()
    assert m.ignore_websockets is False
    assert m.capabilities is None
    assert (m.vram, m.gpus, m.persistent) == (None, None, False)
    assert m.line == 2


def test_multi_line_cmd_with_comments_continuations_and_quotes() -> None:
    config = load("""\
        models:
          m:
            cmd: |
              # launcher
              /opt/server --port ${PORT} \\
                --model "/models/a b.gguf"
              # --disabled-flag
              --alias 'x y'
        """)
    m = config.models["m"]
    assert m.cmd == ("/opt/server", "--port", "5800", "--model", "/models/a b.gguf", "--alias", "x y")
    assert m.cmd_text == "/opt/server --port 5800 \\\n  --model \"/models/a b.gguf\"\n--alias 'x y'"


def test_cmd_is_required_and_must_not_be_empty() -> None:
    assert one_error("models:\n  m:\n    proxy: http://x:1\n") == (
        "config.yaml:2: models.m.cmd: is required: the command line that starts the model's server"
    )
    assert one_error("models:\n  m:\n    cmd: '# only a comment'\n    proxy: http://x:1\n") == (
        "config.yaml:3: models.m.cmd: empty command; give the command line that starts the model's server"
    )


def test_cmd_with_unclosed_quote_is_an_error() -> None:
    error = one_error("models:\n  m:\n    cmd: srv --port ${PORT} 'open\n")
    assert error == (
        "config.yaml:3: models.m.cmd: cannot split the command line: No closing quotation; "
        "close the quote or escape it with \\"
    )


def test_cmd_must_be_text() -> None:
    error = one_error("models:\n  m:\n    cmd: [srv, --port]\n    proxy: http://x:1\n")
    assert error == "config.yaml:3: models.m.cmd: must be text, got a list"


def test_model_must_be_a_mapping() -> None:
    assert one_error("models:\n  m: srv\n") == (
        'config.yaml:2: models.m: must be a mapping of model settings (cmd, proxy, ...), got "srv"'
    )
    assert one_error("models: [a]\n") == (
        "config.yaml:1: models: must be a mapping of model ids to model settings, got a list"
    )


def test_ttl_minus_one_uses_global_ttl_and_zero_means_never() -> None:
    config = load("""\
        globalTTL: 300
        models:
          a: {cmd: "srv --port ${PORT}"}
          b: {cmd: "srv --port ${PORT}", ttl: -1}
          c: {cmd: "srv --port ${PORT}", ttl: 0}
          d: {cmd: "srv --port ${PORT}", ttl: 12.5}
        """)
    assert [config.models[k].ttl for k in "abcd"] == [300, 300, 0, 12.5]


def test_ttl_below_minus_one_says_what_is_accepted() -> None:
    assert one_error(model("    ttl: -5\n")) == (
        "config.yaml:4: models.m.ttl: must be -1 (use globalTTL), 0 (never unload) or a positive number of "
        "seconds, got -5"
    )


def test_ttl_must_be_a_number() -> None:
    assert one_error(model("    ttl: soon\n")) == (
        'config.yaml:4: models.m.ttl: must be a number of seconds (-1 = globalTTL, 0 = never unload), got '
        '"soon"'
    )


def test_unload_timeout_zero_uses_the_global_value() -> None:
    config = load(
        "unloadTimeout: 20\nmodels:\n  a: {cmd: 'srv --port ${PORT}'}\n  b: {cmd: 's --port ${PORT}', "
        "unloadTimeout: 3}\n"
    )
    assert (config.models["a"].unload_timeout, config.models["b"].unload_timeout) == (20, 3)
    assert one_error(model("    unloadTimeout: -1\n")) == (
        "config.yaml:4: models.m.unloadTimeout: must be >= 0, got -1; "
        "accepted: 0 (use the global unloadTimeout) or seconds"
    )


def test_model_health_check_timeout_is_honoured_with_a_one_second_floor() -> None:
    config = load("""\
        healthCheckTimeout: 5
        models:
          fast: {cmd: "srv --port ${PORT}", healthCheckTimeout: 2}
          tiny: {cmd: "srv --port ${PORT}", healthCheckTimeout: 0.2}
          default: {cmd: "srv --port ${PORT}"}
        """)
    assert config.health_check_timeout == 15
    assert config.models["fast"].health_check_timeout == 2
    assert config.models["tiny"].health_check_timeout == 1
    assert config.models["default"].health_check_timeout == 15
    assert config.warnings == (
        "config.yaml:1: healthCheckTimeout: 5 is below the minimum of 15 seconds, using 15 "
        "(a model's own healthCheckTimeout may be shorter)",
        "config.yaml:4: models.tiny.healthCheckTimeout: 0.2 is below the minimum of 1 second, using 1",
    )


def test_aliases_are_registered_and_objects_are_accepted() -> None:
    config = load(model("    aliases: [gpt-4o-mini, {id: smart, name: Smart}]\n"))
    assert config.models["m"].aliases == ("gpt-4o-mini", "smart")
    assert config.aliases == {"gpt-4o-mini": "m", "smart": "m"}
    assert config.real_model_name("smart") == "m"
    assert config.real_model_name("m") == "m"
    assert config.real_model_name("nope") is None


def test_duplicate_alias_across_models_names_both_lines() -> None:
    errors = errors_of("""\
        models:
          a:
            cmd: srv --port ${PORT}
            aliases: [shared]
          b:
            cmd: srv --port ${PORT}
            aliases:
              - shared
        """)
    assert errors == [
        "config.yaml:8: models.b.aliases[0]: duplicate alias shared found in model: b "
        "(already an alias of a at line 4)"
    ]


def test_alias_equal_to_a_model_id_is_an_error() -> None:
    error = one_error("""\
        models:
          a: {cmd: "srv --port ${PORT}", aliases: [b]}
          b: {cmd: "srv --port ${PORT}"}
        """)
    assert error == "config.yaml:2: models.a.aliases[0]: alias b is also a model id; rename the alias"


def test_empty_alias_is_an_error() -> None:
    assert one_error(model("    aliases: ['  ']\n")) == (
        'config.yaml:4: models.m.aliases[0]: must be an alias name, got "  "'
    )


def test_env_entries_become_pairs_and_malformed_ones_are_errors() -> None:
    config = load(model("    env: ['A=1', 'B=x=y', 'EMPTY=']\n"))
    assert config.models["m"].env == (("A", "1"), ("B", "x=y"), ("EMPTY", ""))
    errors = errors_of(model("    env:\n      - NOEQUALS\n      - =value\n      - {A: 1}\n"))
    assert errors == [
        "config.yaml:5: models.m.env[0]: must be KEY=value, got 'NOEQUALS'",
        "config.yaml:6: models.m.env[1]: must be KEY=value, got '=value'",
        "config.yaml:7: models.m.env[2]: must be text, got a mapping",
    ]


def test_text_and_flag_settings() -> None:
    m = load(
        model(
            "    useModelName: upstream-name\n"
            "    unlisted: true\n"
            "    name: '  Pretty Name '\n"
            "    description: what it does\n"
            "    checkEndpoint: none\n"
            "    compat: {ignoreWebsockets: yes}\n"
            "    persistent: true\n"
        )
    ).models["m"]
    assert (m.use_model_name, m.unlisted, m.name, m.description) == (
        "upstream-name",
        True,
        "Pretty Name",
        "what it does",
    )
    assert m.check_endpoint == "none"
    assert m.ignore_websockets is True
    assert m.persistent is True


def test_flag_must_be_true_or_false() -> None:
    assert one_error(model("    unlisted: maybe\n")) == (
        'config.yaml:4: models.m.unlisted: must be true or false, got "maybe"'
    )


def test_concurrency_limit_zero_means_ten() -> None:
    assert load(model("    concurrencyLimit: 0\n")).models["m"].concurrency_limit == 10
    assert load(model("    concurrencyLimit: 3\n")).models["m"].concurrency_limit == 3
    config = load(model("    concurrencyLimit: -2\n"))
    assert config.models["m"].concurrency_limit == 10
    assert config.warnings == (
        "config.yaml:4: models.m.concurrencyLimit: -2 is not a limit, using the default of 10",
    )


def test_send_loading_state_per_model_overrides_global() -> None:
    config = load("""\
        sendLoadingState: true
        models:
          a: {cmd: "srv --port ${PORT}"}
          b: {cmd: "srv --port ${PORT}", sendLoadingState: false}
        """)
    assert (config.models["a"].send_loading_state, config.models["b"].send_loading_state) == (True, False)


def test_filters_strip_and_set_params() -> None:
    m = load(
        model(
            "    filters:\n"
            "      stripParams: ' top_k, temperature,,model, top_k '\n"
            "      setParams: {temperature: 0.7, model: forced, nested: {a: [1, 2]}}\n"
        )
    ).models["m"]
    assert m.filters.strip_params == ("temperature", "top_k")
    assert m.filters.set_params == {"temperature": 0.7, "nested": {"a": [1, 2]}}


def test_filters_legacy_strip_params_spelling() -> None:
    m = load(model("    filters:\n      strip_params: top_p, min_p\n")).models["m"]
    assert m.filters.strip_params == ("min_p", "top_p")


def test_set_params_by_id_registers_aliases_except_own_id() -> None:
    config = load(
        model(
            "    aliases: [explicit]\n"
            "    filters:\n"
            "      setParamsByID:\n"
            "        m: {effort: medium}\n"
            "        m:high: {effort: high, model: dropped}\n"
            "        explicit: {effort: low}\n"
        )
    )
    m = config.models["m"]
    assert m.filters.set_params_by_id == {
        "m": {"effort": "medium"},
        "m:high": {"effort": "high"},
        "explicit": {"effort": "low"},
    }
    assert config.aliases == {"explicit": "m", "m:high": "m"}
    assert m.aliases == ("explicit",)


def test_set_params_by_id_conflicts() -> None:
    errors = errors_of("""\
        models:
          a:
            cmd: srv --port ${PORT}
            aliases: [taken]
          b:
            cmd: srv --port ${PORT}
            filters:
              setParamsByID:
                a: {x: 1}
                taken: {x: 2}
                fine: [1]
        """)
    assert errors == [
        "config.yaml:9: models.b.filters.setParamsByID.a: model b filters.setParamsByID: "
        "key 'a' conflicts with an existing model ID",
        "config.yaml:10: models.b.filters.setParamsByID.taken: duplicate alias 'taken' in model b "
        "filters.setParamsByID, already used by model a (line 4)",
        "config.yaml:11: models.b.filters.setParamsByID.fine: must be a mapping of request fields to values, "
        "got a list",
    ]


def test_metadata_is_free_form() -> None:
    m = load(model("    metadata: {a: 1, b: [x, {c: null}]}\n")).models["m"]
    assert m.metadata == {"a": 1, "b": ["x", {"c": None}]}
    assert (
        one_error(model("    metadata: [1]\n"))
        == "config.yaml:4: models.m.metadata: must be a mapping, got a list"
    )


def test_timeouts_override_defaults_and_reject_negative_values() -> None:
    m = load(model("    timeouts: {connect: 5, responseHeader: 60, idleConn: 0}\n")).models["m"]
    assert m.timeouts == Timeouts(connect=5, response_header=60, idle_conn=0)
    assert one_error(model("    timeouts: {connect: -1}\n")) == (
        "config.yaml:4: models.m.timeouts.connect: must be >= 0, got -1; accepted: 0 (no limit) or seconds"
    )


def test_capabilities() -> None:
    m = load(
        model("    capabilities: {in: [text, image], out: [text], tools: true, context: 8192, extra: 1}\n")
    )
    assert m.models["m"].capabilities == Capabilities(
        input=("text", "image"), output=("text",), tools=True, context=8192
    )
    assert m.warnings == ()
    assert load(model("    capabilities: {reranker: true}\n")).models["m"].capabilities == Capabilities(
        reranker=True
    )
    assert load(model("    capabilities: {}\n")).models["m"].capabilities is None
    errors = errors_of(model("    capabilities:\n      in: [smell]\n      context: -1\n"))
    assert errors == [
        "config.yaml:5: models.m.capabilities.in[0]: invalid modality 'smell', must be one of: text, audio, "
        "image",
        "config.yaml:6: models.m.capabilities.context: must be >= 0, got -1",
    ]


@pytest.mark.parametrize(
    ("text", "size"), [("6.5GB", 6_500_000_000), ("512MiB", 512 * 1024**2), ("24", 24 * 10**9)]
)
def test_vram_is_a_size(text: str, size: int) -> None:
    assert load(model(f"    vram: {text}\n")).models["m"].vram == size


def test_vram_bad_size_is_an_error() -> None:
    error = one_error(model("    vram: lots\n"))
    assert error.startswith("config.yaml:4: models.m.vram: expected a size such as 6.5GB")


def test_gpus_explicit_or_from_cuda_visible_devices() -> None:
    assert load(model("    gpus: [0, 1]\n")).models["m"].gpus == (0, 1)
    assert load(model("    gpus: []\n")).models["m"].gpus == ()
    assert load(model("    env: ['CUDA_VISIBLE_DEVICES=2,3']\n")).models["m"].gpus == (2, 3)
    assert load(model("    env: ['CUDA_VISIBLE_DEVICES=0', 'CUDA_VISIBLE_DEVICES=1']\n")).models[
        "m"
    ].gpus == (1,)
    assert load(model("    env: ['CUDA_VISIBLE_DEVICES=']\n")).models["m"].gpus == ()
    both = load(model("    gpus: [1]\n    env: ['CUDA_VISIBLE_DEVICES=0']\n"))
    assert both.models["m"].gpus == (1,)


def test_gpus_uuid_in_cuda_visible_devices_warns() -> None:
    config = load(model("    env: ['CUDA_VISIBLE_DEVICES=GPU-3b1c']\n"))
    assert config.models["m"].gpus is None
    assert config.warnings == (
        "config.yaml:4: models.m.env: CUDA_VISIBLE_DEVICES=GPU-3b1c does not name device indexes; "
        "set gpus: [0, 1] to tell llmswap the devices",
    )


def test_gpus_must_be_device_indexes() -> None:
    assert one_error(model("    gpus: [0, -1]\n")) == (
        "config.yaml:4: models.m.gpus[1]: must be a device index (0, 1, ...), got -1"
    )


def test_invalid_proxy_url_is_an_error() -> None:
    error = one_error("models:\n  m:\n    cmd: srv\n    proxy: localhost:8080\n")
    assert error == (
        "config.yaml:4: models.m.proxy: invalid proxy URL 'localhost:8080'; "
        "give the server's base URL, e.g. http://127.0.0.1:8080"
    )


def test_unknown_model_key_warns_with_a_suggestion() -> None:
    config = load(model("    tll: 5\n    frobnicate: true\n"))
    assert config.warnings == (
        "config.yaml:4: models.m.tll: unknown key, ignored; did you mean 'ttl'?",
        "config.yaml:5: models.m.frobnicate: unknown key, ignored",
    )
    assert config.models["m"].ttl == 0


def test_alias_equal_to_its_own_model_id_is_ignored_with_a_warning() -> None:
    config = load(model("    aliases: [m, other]\n"))
    assert config.models["m"].aliases == ("other",)
    assert dict(config.aliases) == {"other": "m"}
    assert config.warnings == ("config.yaml:4: models.m.aliases[0]: m is the model's own id; ignored",)


def test_a_missing_cmd_names_the_near_miss_and_the_hint_stays_beside_the_errors() -> None:
    errors = errors_of("models:\n  other:\n    command: srv --port 8080\n    proxy: http://127.0.0.1:8080\n"
                       "    ttl: -5\n")
    assert errors == [
        "config.yaml:2: models.other.cmd: is required: the command line that starts the model's server; "
        "'command' is not a key here, did you mean 'cmd'?",
        "warning: config.yaml:3: models.other.command: unknown key, ignored; did you mean 'cmd'?",
        "config.yaml:5: models.other.ttl: must be -1 (use globalTTL), 0 (never unload) or a positive number "
        "of seconds, got -5",
    ]


def test_a_suggestion_prefers_the_key_a_word_abbreviates() -> None:
    assert closest("command", ("cmd", "compat", "cmdStop")) == "cmd"
    assert closest("tll", ("ttl", "tls")) == "ttl"
    assert closest("frobnicate", ("ttl", "cmd")) is None
