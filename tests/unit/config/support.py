"""Helpers for the config tests: load YAML text (dedented, line 1 = first line) and read its errors."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

import pytest

from llmswap.config import Config, ConfigError, load_config_text


def load(text: str, env: Mapping[str, str] | None = None, *, path: str = "config.yaml") -> Config:
    return load_config_text(textwrap.dedent(text), path=path, environ=env or {})


def errors_of(text: str, env: Mapping[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(text, env)
    assert str(caught.value) == "\n".join(caught.value.errors)
    return list(caught.value.errors)


def one_error(text: str, env: Mapping[str, str] | None = None) -> str:
    errors = errors_of(text, env)
    assert len(errors) == 1, errors
    return errors[0]
