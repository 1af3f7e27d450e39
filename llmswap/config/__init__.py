"""The configuration: llama-swap's YAML schema (plus llmswap's additions) loaded into frozen dataclasses.

Usage: `config = load_config("config.yaml")` (raises `ConfigError` listing every problem), or
`ConfigSources(file, directory).load()` for a file merged with a directory of files, and
`format_config(config)` for the resolved YAML that `llmswap check-config` prints.
"""

from llmswap.config.errors import ConfigError, Problem
from llmswap.config.loader import load_config, load_config_text
from llmswap.config.model import (
    DEFAULT_GROUP_ID,
    AdmissionConfig,
    ApiKey,
    BatchSettings,
    Capabilities,
    Config,
    Filters,
    GroupConfig,
    MatrixConfig,
    ModelConfig,
    PeerConfig,
    RouterConfig,
    RoutingConfig,
    SchedulerConfig,
    TasksConfig,
    TaskTypeConfig,
    Timeouts,
    VramSettings,
)
from llmswap.config.render import format_config
from llmswap.config.sizes import parse_size
from llmswap.config.sources import ConfigSources

__all__ = [
    "DEFAULT_GROUP_ID",
    "AdmissionConfig",
    "ApiKey",
    "BatchSettings",
    "Capabilities",
    "Config",
    "ConfigError",
    "ConfigSources",
    "Filters",
    "GroupConfig",
    "MatrixConfig",
    "ModelConfig",
    "PeerConfig",
    "Problem",
    "RouterConfig",
    "RoutingConfig",
    "SchedulerConfig",
    "TaskTypeConfig",
    "TasksConfig",
    "Timeouts",
    "VramSettings",
    "format_config",
    "load_config",
    "load_config_text",
    "parse_size",
]
