"""The config's JSON Schema: generated from the keys the loader accepts, kept in config-schema.json, and
what every example config is written against (checked with the jsonschema package)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from llmswap.config import keys
from llmswap.config.common import TIMEOUT_KEYS
from llmswap.config.schema import config_schema, schema_text

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = [ROOT / "config.example.yaml", ROOT / "container" / "config.yaml",
            *sorted(p for p in (ROOT / "examples").glob("*.yaml") if p.name != "compose.yaml")]
VALIDATOR = jsonschema.Draft202012Validator(config_schema())


def problems(document: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(document)]


def test_the_schema_is_valid_draft_2020_12_and_config_schema_json_is_its_output() -> None:
    jsonschema.Draft202012Validator.check_schema(config_schema())
    kept = (ROOT / "config-schema.json").read_text()
    assert kept == schema_text(), "run: llmswap schema > config-schema.json"
    printed = subprocess.run([sys.executable, "-m", "llmswap", "schema"], capture_output=True, text=True,
                             check=True, timeout=60)
    assert printed.stdout == schema_text()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates_and_names_the_schema_for_editors(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# yaml-language-server: $schema="), "the first line tells the editor the schema"
    assert problems(yaml.safe_load(text)) == []


def test_llama_swaps_own_example_validates() -> None:
    for name in ("llama-swap-example.yaml", "llama-swap-real.yaml"):
        assert problems(yaml.safe_load((ROOT / "tests/unit/config/data" / name).read_text())) == []


def test_a_misspelt_key_and_a_wrong_type_are_flagged() -> None:
    document = {"healthCheckTimout": 60, "models": {"m": {"cmd": "srv --port ${PORT}", "ttl": "soon",
                                                          "kvCache": "yes please"}}}
    assert sorted(problems(document)) == [
        ": Additional properties are not allowed ('healthCheckTimout' was unexpected)",
        "models.m.kvCache: 'yes please' is not valid under any of the given schemas",
        "models.m.ttl: 'soon' is not valid under any of the given schemas",
    ]
    assert problems({"models": {"m": {"cmd": "srv", "ttl": "${default_ttl}"}}}) == []  # a macro


def test_every_key_says_what_it_does_and_the_loader_takes_its_key_lists_from_the_same_definitions() -> None:
    sections = [value for value in vars(keys).values() if isinstance(value, keys.Section)]
    assert all(key.about for section in sections for key in section.keys)
    assert set(TIMEOUT_KEYS) == set(keys.TIMEOUTS)  # the loader's attribute names, by the same keys
    from llmswap.config import loader, models_section, peers_section

    assert loader.TOP_LEVEL_KEYS is keys.ROOT and models_section.MODEL_KEYS is keys.MODEL
    assert peers_section.PEER_KEYS is keys.PEER
    schema = json.loads(schema_text())
    assert set(schema["properties"]) == {*keys.ROOT, *keys.ROOT.ignored}
    assert schema["properties"]["prefetch"]["default"] is True
