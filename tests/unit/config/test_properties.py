"""Property: whatever the input, the loader returns a Config or raises ConfigError, nothing else."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmswap.config import Config, ConfigError, format_config, load_config_text
from llmswap.config.capabilities_section import CAPABILITY_KEYS
from llmswap.config.loader import IGNORED_TOP_LEVEL_KEYS, TOP_LEVEL_KEYS
from llmswap.config.models_section import MODEL_KEYS

REAL = (Path(__file__).parent / "data" / "llama-swap-real.yaml").read_text()
ENV = {"MODELS_DIR": "/models", "LLAMA_SWAP_KEY": "sk-k", "OPENROUTER_API_KEY": "sk-o", "X": "x y"}

# Keys from every level of the schema, so random documents reach deep into the loader.
VOCABULARY = sorted(
    {
        *TOP_LEVEL_KEYS,
        *IGNORED_TOP_LEVEL_KEYS,
        *MODEL_KEYS,
        *CAPABILITY_KEYS,
        "router",
        "scheduler",
        "settings",
        "use",
        "groups",
        "matrix",
        "vars",
        "sets",
        "evict_costs",
        "budget",
        "reserve",
        "fifo",
        "batch",
        "priority",
        "admission",
        "maxQueue",
        "policy",
        "members",
        "swap",
        "exclusive",
        "on_startup",
        "preload",
        "ignorePaths",
        "stripParams",
        "setParams",
        "setParamsByID",
        "strip_params",
        "connect",
        "responseHeader",
        "ignoreWebsockets",
        "key",
        "maxConcurrent",
        "types",
        "model",
        "db",
        "maxQueueDepth",
        "id",
        "a",
        "b",
        "m",
        "qwen",
    }
)
TEXT_PIECES = [
    "${PORT}",
    "${MODEL_ID}",
    "${PID}",
    "${env.X}",
    "${env.UNSET}",
    "${a}",
    "srv --port ${PORT}",
    "http://localhost:1",
    "6.5GB",
    "-1",
    "0",
    "a & b",
    "(a | b",
    "+s",
    "'",
    '"',
    "\\",
    "#",
    "\n",
    " ",
    "KEY=value",
    "CUDA_VISIBLE_DEVICES=0,1",
    "GPU-1",
    "matrix",
    "group",
    "vram",
    "fifo",
    "batch",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.sampled_from(TEXT_PIECES), max_size=4).map("".join),
)
keys = st.one_of(st.sampled_from(VOCABULARY), st.text(max_size=8))
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=5),
    ),
    max_leaves=40,
)

YAML_PIECES = [
    "models:",
    "\n",
    "  ",
    "    ",
    "- ",
    ": ",
    "cmd: ",
    "srv --port ${PORT}",
    "${env.X}",
    "${env.NOPE}",
    "&a ",
    "*a",
    "<<: ",
    "{",
    "}",
    "[",
    "]",
    "'",
    '"',
    "# ${env.NOPE}",
    "macros:",
    "x: ${x}",
    "routing:",
    "router:",
    "use: matrix",
    "groups:",
    "matrix:",
    "sets:",
    "s: a & b",
    "peers:",
    "!!int ",
    "!!binary ",
    "---",
    "...",
    "? ",
    "|",
    ">",
    "\t",
    "%YAML 1.2\n",
    "ttl: -5",
    "apiKeys:",
    "tasks:",
]


def _loads_or_config_error(text: str) -> None:
    try:
        config = load_config_text(text, environ=ENV)
    except ConfigError as error:
        assert error.errors, "a ConfigError must carry at least one message"
        for message in error.errors:
            assert message.removeprefix("warning: ").startswith("config.yaml"), message
        return
    assert isinstance(config, Config)
    yaml.safe_load(format_config(config))


# CONFIG_FUZZ_EXAMPLES=5000 (with --timeout 0) runs a longer search than the default.
EXAMPLES = int(os.environ.get("CONFIG_FUZZ_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Each example loads and re-renders the whole real file: fewer of them keep the suite quick.
REAL_FILE_SETTINGS = settings(SETTINGS, max_examples=max(1, EXAMPLES // 3))


@SETTINGS
@given(st.text(max_size=200))
def test_any_text_loads_or_raises_config_error(text: str) -> None:
    _loads_or_config_error(text)


@SETTINGS
@given(st.lists(st.sampled_from(YAML_PIECES), max_size=40).map("".join))
def test_yaml_like_text_loads_or_raises_config_error(text: str) -> None:
    _loads_or_config_error(text)


@SETTINGS
@given(documents)
def test_any_document_loads_or_raises_config_error(document: Any) -> None:
    _loads_or_config_error(yaml.safe_dump(document, allow_unicode=True))


@SETTINGS
@given(
    st.dictionaries(st.sampled_from(VOCABULARY), documents, max_size=6),
    st.dictionaries(keys, documents, max_size=3),
)
def test_documents_shaped_like_configs_load_or_raise_config_error(
    top: dict[str, Any], model: dict[str, Any]
) -> None:
    top["models"] = {"m": {"cmd": "srv --port ${PORT}", **model}, "n": model}
    _loads_or_config_error(yaml.safe_dump(top, allow_unicode=True))


@REAL_FILE_SETTINGS
@given(
    st.integers(min_value=0, max_value=len(REAL)),
    st.integers(min_value=0, max_value=80),
    st.lists(st.sampled_from(YAML_PIECES), max_size=6).map("".join),
)
def test_edited_real_config_loads_or_raises_config_error(start: int, length: int, insert: str) -> None:
    _loads_or_config_error(REAL[:start] + insert + REAL[start + length :])
