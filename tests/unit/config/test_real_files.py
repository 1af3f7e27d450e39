"""Whole files: a real llama-swap configuration, config.example.yaml, and format_config's output."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmswap.config import (
    DEFAULT_GROUP_ID,
    Capabilities,
    Config,
    ConfigError,
    GroupConfig,
    Timeouts,
    format_config,
    load_config,
    load_config_text,
)

DATA = Path(__file__).parent / "data"
REAL = DATA / "llama-swap-real.yaml"
EXAMPLE = Path(__file__).parents[3] / "config.example.yaml"
REAL_ENV = {
    "MODELS_DIR": "/models",
    "LLAMA_SWAP_KEY": "sk-from-env",
    "OPENROUTER_API_KEY": "sk-or-secret-key",
}
EXAMPLE_ENV = {"LLMSWAP_API_KEY": "sk-example-key-0123", "OPENROUTER_API_KEY": "sk-or-example"}
LLAMA = "/opt/llama.cpp/build/bin/llama-server"
SERVER = (LLAMA, "--host", "127.0.0.1")


@pytest.fixture(scope="module")
def real() -> Config:
    return load_config(REAL, environ=REAL_ENV)


def test_real_config_loads_without_warnings(real: Config) -> None:
    assert real.warnings == ()
    assert list(real.models) == [
        "qwen3-30b-a3b",
        "gemma3-12b",
        "nomic-embed",
        "whisper",
        "vllm-qwen-vl",
        "llama-70b",
    ]


def test_real_config_globals(real: Config) -> None:
    assert (real.health_check_timeout, real.start_port, real.global_ttl) == (300, 10001, 900)
    assert (real.log_level, real.log_to_stdout, real.log_time_format) == ("info", "proxy", "rfc3339")
    assert real.send_loading_state and real.include_aliases_in_list
    assert [key.key for key in real.api_keys] == ["sk-local-dev-1234567890", "sk-from-env"]
    assert real.upstream_ignore_paths == (r".*\.(js|css|png|ico)$", "^/favicon")
    assert real.state_dir == DATA / ".llmswap-state"


def test_real_config_ports_in_sorted_id_order(real: Config) -> None:
    ports = {model_id: model.port for model_id, model in real.models.items()}
    assert ports == {
        "gemma3-12b": 10001,
        "llama-70b": 10002,
        "nomic-embed": 10003,
        "qwen3-30b-a3b": 10004,
        "vllm-qwen-vl": None,
        "whisper": 10005,
    }


def test_real_config_multi_line_cmd_with_macros_comments_and_continuation(real: Config) -> None:
    qwen = real.models["qwen3-30b-a3b"]
    assert qwen.cmd == (
        *SERVER,
        "--port",
        "10004",
        "--flash-attn",
        "on",
        "--model",
        "/models/Qwen3-30B-A3B-Q4_K_M.gguf",
        "--ctx-size",
        "32768",
        "-ngl",
        "99",
        "--jinja",
        "--temp",
        "0.7",
        "--top-p",
        "0.8",
    )
    assert "#" not in qwen.cmd_text
    assert qwen.proxy == "http://localhost:10004"
    assert qwen.ttl == 900
    assert qwen.gpus == (0,)
    assert (qwen.name, qwen.description) == ("Qwen3 30B A3B", "MoE, fast general chat")
    assert qwen.filters.strip_params == ("temperature", "top_k", "top_p")
    assert qwen.filters.set_params_by_id == {
        "qwen3-30b-a3b:thinking": {"chat_template_kwargs": {"enable_thinking": True}}
    }
    assert qwen.metadata == {"port": 10004, "context": 32768, "note": "qwen3-30b-a3b listens on 10004"}


def test_real_config_other_models(real: Config) -> None:
    gemma = real.models["gemma3-12b"]
    assert gemma.cmd[-4:] == ("--ctx-size", "8192", "-ngl", "99")  # the global ctx, not qwen's
    assert (gemma.ttl, gemma.concurrency_limit, gemma.gpus) == (0, 4, (1,))
    assert gemma.capabilities == Capabilities(
        input=("text", "image"), output=("text",), tools=True, context=8192
    )

    embed = real.models["nomic-embed"]
    assert embed.cmd == (LLAMA, "--port", "10003", "--embedding", "-m", "/models/nomic embed v1.5.gguf")
    assert (embed.unlisted, embed.use_model_name) == (True, "nomic-embed-text-v1.5")

    whisper = real.models["whisper"]
    assert (whisper.check_endpoint, whisper.unload_timeout) == ("none", 3)

    vllm = real.models["vllm-qwen-vl"]
    assert vllm.cmd[:5] == ("docker", "run", "--rm", "--name", "vllm-qwen-vl")
    assert vllm.cmd_stop == ("docker", "stop", "vllm-qwen-vl")
    assert vllm.proxy == "http://127.0.0.1:8000"
    assert vllm.health_check_timeout == 600
    assert vllm.timeouts == Timeouts(response_header=120)
    assert vllm.ignore_websockets is True

    llama = real.models["llama-70b"]
    assert llama.cmd_stop == ("kill", "-TERM", "${PID}")
    assert llama.send_loading_state is False
    assert llama.health_check_timeout == 300


def test_real_config_aliases_routing_hooks_peers(real: Config) -> None:
    assert dict(real.aliases) == {
        "qwen": "qwen3-30b-a3b",
        "gpt-4o-mini": "qwen3-30b-a3b",
        "qwen3-30b-a3b:thinking": "qwen3-30b-a3b",
    }
    router = real.routing.router
    assert router.use == "matrix"
    assert router.matrix is not None
    assert router.matrix.sets == (
        ("helpers", "e & w"),
        ("chat", "(q | g) & +helpers"),
        ("vision", "vl & e"),
        ("big", "L"),
    )
    assert dict(router.matrix.evict_costs) == {"vllm-qwen-vl": 40, "llama-70b": 30}
    assert router.matrix.program.solve("gemma3-12b", ["qwen3-30b-a3b", "whisper"]).evict == ("qwen3-30b-a3b",)
    assert dict(real.routing.scheduler.priority) == {"qwen3-30b-a3b": 10, "nomic-embed": 5}
    assert real.preload == ("qwen3-30b-a3b", "nomic-embed")
    openrouter = real.peers["openrouter"]
    assert (openrouter.api_key, openrouter.models) == (
        "sk-or-secret-key",
        ("meta-llama/llama-3.1-8b-instruct", "deepseek/deepseek-v3.2"),
    )
    assert openrouter.filters.set_params == {"provider": {"data_collection": "deny"}}
    assert real.peers["lab-box"].timeouts.response_header == 300


def test_real_config_groups_when_the_group_router_is_picked() -> None:
    text = REAL.read_text().replace("    use: matrix\n", "    use: group\n")
    groups = load_config_text(text, path=str(REAL), environ=REAL_ENV).routing.router.groups
    assert groups["chat"] == GroupConfig(
        "chat", swap=True, exclusive=False, members=("qwen3-30b-a3b", "gemma3-12b")
    )
    assert groups["helpers"] == GroupConfig(
        "helpers", swap=False, exclusive=False, persistent=True, members=("nomic-embed", "whisper")
    )
    assert groups[DEFAULT_GROUP_ID].members == ("llama-70b", "vllm-qwen-vl")


def test_real_config_needs_its_environment() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(REAL, environ={"MODELS_DIR": "/models"})
    assert "environment variable 'LLAMA_SWAP_KEY' is not set" in str(caught.value)
    assert "NOT_SET_BUT_IN_A_COMMENT" not in str(caught.value)


@pytest.mark.parametrize("router", ["group", "matrix", "vram"])
def test_example_config_loads_cleanly_with_each_router(router: str) -> None:
    text = EXAMPLE.read_text().replace("    use: group\n", f"    use: {router}\n")
    config = load_config_text(text, path=str(EXAMPLE), environ=EXAMPLE_ENV)
    assert config.warnings == ()
    assert config.routing.router.use == router


def test_example_config_values() -> None:
    config = load_config(EXAMPLE, environ=EXAMPLE_ENV)
    qwen = config.models["qwen3-8b"]
    assert qwen.port == 5801  # nomic-embed sorts first
    assert qwen.cmd[:4] == ("/opt/llama.cpp/build/bin/llama-server", "--host", "127.0.0.1", "--port")
    assert qwen.vram == 6_500_000_000
    assert config.api_keys[0].key == "sk-example-key-0123"
    assert config.tasks is not None and config.tasks.types["summarize"].model == "qwen3-8b"
    batch = load_config_text(
        EXAMPLE.read_text().replace("    use: fifo\n", "    use: batch\n"),
        path=str(EXAMPLE),
        environ=EXAMPLE_ENV,
    )
    assert batch.routing.scheduler.use == "batch"


def test_format_config_shows_resolved_values_and_hides_keys(real: Config) -> None:
    text = format_config(real)
    document = yaml.safe_load(text)
    qwen = document["models"]["qwen3-30b-a3b"]
    assert qwen["port"] == 10004
    assert qwen["argv"][:5] == [*SERVER, "--port", "10004"]
    assert qwen["proxy"] == "http://localhost:10004"
    assert document["models"]["llama-70b"]["cmdStop"] == "kill -TERM ${PID}"
    assert document["routing"]["router"]["use"] == "matrix"
    assert document["aliases"]["gpt-4o-mini"] == "qwen3-30b-a3b"
    assert "sk-from-env" not in text and "sk-or-secret-key" not in text
    assert document["apiKeys"][0]["key"] == "sk-l… (23 characters)"


def test_format_config_puts_warnings_first_as_comments() -> None:
    config = load_config_text("healthCheckTimeout: 1\nmodels: {}\n")
    text = format_config(config)
    assert text.startswith("# warning: config.yaml:1: healthCheckTimeout: 1 is below the minimum")
    assert yaml.safe_load(text)["healthCheckTimeout"] == 15


def test_format_config_keeps_a_long_command_on_one_line() -> None:
    """A command longer than any line width is shown whole: a fold would split `--key ${env.X}` in two."""
    prefix = "/a/long/install/path/" * 8
    config = load_config_text(
        "models:\n"
        "  m:\n"
        f"    cmd: {prefix}llama-server --port ${{PORT}} --api-key ${{env.SOME_KEY}}\n",
        environ={"SOME_KEY": "sk-hidden-value"},
    )
    [line] = [line for line in format_config(config).splitlines() if line.strip().startswith("cmd:")]
    assert line.endswith("--api-key ${env.SOME_KEY}")
