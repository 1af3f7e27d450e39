"""The configuration's JSON Schema (draft 2020-12), generated from the keys the loader accepts
(`llmswap.config.keys`): what `llmswap schema` prints and `config-schema.json` holds.

Editors use it to complete keys and flag mistakes as a file is written (`# yaml-language-server: $schema=`,
or a schema mapping in the editor's settings). A key the loader does not know is flagged (the loader warns
and ignores it); a value of the wrong type is flagged (the loader refuses it). Every scalar may also be a
macro (`${name}`), which the loader expands before it reads the type, and null (the default).
"""

from __future__ import annotations

import json
from typing import Any

from llmswap.config.keys import API_KEY, NO_DEFAULT, ROOT, Key, Section


def config_schema() -> dict[str, Any]:
    schema = _section(ROOT)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "llmswap configuration",
        **schema,
        "$defs": {"apiKey": _section(API_KEY)},
    }


def schema_text() -> str:
    """The schema as `config-schema.json` holds it."""
    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"


def _section(section: Section) -> dict[str, Any]:
    properties = {key.name: _key(key) for key in section.keys}
    for name in section.ignored:
        properties[name] = {"description": "a llama-swap key llmswap accepts and ignores"}
    return {
        "type": ["object", "null"],
        "description": section.title,
        "properties": properties,
        "additionalProperties": section.lenient,
    }


def _key(key: Key) -> dict[str, Any]:
    about = key.about + (" (llmswap)" if key.llmswap else "")
    if key.section is not None:
        found = _section(key.section)
    elif key.entries is not None:
        found = {"type": ["object", "null"], "additionalProperties": _section(key.entries)}
    else:
        found = dict(key.value)
    found["description"] = about
    if key.default is not NO_DEFAULT:
        found["default"] = key.default
    return found
