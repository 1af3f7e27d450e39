"""What is displayed of a model's command: written `${env.NAME}` references instead of their values, and
secret-looking literals masked; what runs keeps every value."""

from __future__ import annotations

import textwrap

import pytest

from llmswap.config import load_config_text
from llmswap.config.masking import mask_secrets


@pytest.mark.parametrize("text, shown", [
    ("llama-server --api-key sk-123 -m x.gguf", "llama-server --api-key *** -m x.gguf"),
    ("vllm serve q --hf-token=hf_abc --tokenizer Qwen/Q", "vllm serve q --hf-token=*** --tokenizer Qwen/Q"),
    ("srv --password 'two words' --port 1", "srv --password *** --port 1"),
    ("docker run -e HF_TOKEN=hf_x -e MAX_TOKENS=5 img", "docker run -e HF_TOKEN=*** -e MAX_TOKENS=5 img"),
    ("env AWS_SECRET_ACCESS_KEY=abc DB_PASSWORD=pw srv", "env AWS_SECRET_ACCESS_KEY=*** DB_PASSWORD=*** srv"),
    ('curl -H "Authorization: Bearer abc.def" u', 'curl -H "Authorization: Bearer ***" u'),
    ("curl -H 'X-Api-Key: zz' https://user:pw@host/x", "curl -H 'X-Api-Key: ***' https://user:***@host/x"),
])
def test_secret_looking_values_are_masked(text: str, shown: str) -> None:
    assert mask_secrets(text) == shown


@pytest.mark.parametrize("text", [
    "llama-server --port 8080 --max-tokens 5 --tokenizer Qwen/Q --ssl-keyfile /k.pem --keep 4",
    "srv --no-auth --port 1",  # a flag after a switch is not its value
    "srv --api-key ${env.API_KEY} HF_TOKEN=${env.HF_TOKEN}",  # references are no secrets
])
def test_what_is_no_secret_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


CONFIG = """\
macros:
  auth: --api-key ${env.LLM_KEY}
models:
  m:
    cmd: |
      llama-server --port ${PORT} ${auth}
        --hf-token hf_literal
        --alias "${env.LLM_ALIAS}"
    cmdStop: stop-it --pid ${PID} --token ${env.LLM_KEY}
    env: ["UPSTREAM_KEY=${env.LLM_KEY}", "PLAIN=yes"]
"""
ENVIRON = {"LLM_KEY": "sk-very-secret", "LLM_ALIAS": "nick"}


def test_a_model_keeps_its_commands_as_written_beside_the_expanded_ones() -> None:
    model = load_config_text(CONFIG, environ=ENVIRON).models["m"]
    assert model.cmd[-4:] == ("--hf-token", "hf_literal", "--alias", "nick")  # what runs: every value
    assert "sk-very-secret" in model.cmd and ("UPSTREAM_KEY", "sk-very-secret") in model.env
    assert model.cmd_written == textwrap.dedent("""\
        llama-server --port 5800 --api-key ${env.LLM_KEY}
          --hf-token hf_literal
          --alias "${env.LLM_ALIAS}\"""")
    assert model.cmd_shown == model.cmd_written.replace("hf_literal", "***")
    assert model.argv_shown == ("llama-server --port 5800 --api-key '${env.LLM_KEY}' --hf-token *** "
                                "--alias '${env.LLM_ALIAS}'")
    assert model.cmd_stop_shown(42) == "stop-it --pid 42 --token ${env.LLM_KEY}"
    assert model.env_shown == ("UPSTREAM_KEY=${env.LLM_KEY}", "PLAIN=yes")


def test_without_env_references_the_expanded_command_is_shown_masked() -> None:
    model = load_config_text("models:\n  m:\n    cmd: srv --port ${PORT} --api-key sk-lit\n").models["m"]
    assert model.cmd_written == ""
    assert model.cmd_shown == "srv --port 5800 --api-key ***"
