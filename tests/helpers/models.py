"""Configs backed by the demo upstream: one place that knows how to describe a demo model."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from llmswap.config.model import Config, GroupConfig, ModelConfig, RouterConfig, RoutingConfig
from tests.helpers.demo import free_port

WITHIN = 15.0  # generous upper bound for anything the tests wait on


def demo_config(
    model_id: str = "demo", *flags: str, port: int | None = None, **overrides: Any
) -> ModelConfig:
    """A model served by the demo upstream on a free port, with short timeouts."""
    port = free_port() if port is None else port
    config = ModelConfig(
        id=model_id,
        cmd=(sys.executable, "-m", "llmswap.demo", "--port", str(port), "--model-name", model_id, *flags),
        cmd_text=f"python -m llmswap.demo --port {port} --model-name {model_id} {' '.join(flags)}".strip(),
        proxy=f"http://127.0.0.1:{port}",
        health_check_timeout=WITHIN,
        unload_timeout=2.0,
        port=port,
    )
    return dataclasses.replace(config, **overrides)


def exclusive_config(*models: ModelConfig, **overrides: Any) -> Config:
    """A config where every model is in llama-swap's default group: one model at a time."""
    groups = {"(default)": GroupConfig("(default)", members=tuple(sorted(m.id for m in models)))}
    routing = RoutingConfig(router=RouterConfig(use="group", groups=groups))
    return Config(models={m.id: m for m in models}, routing=routing, **overrides)
