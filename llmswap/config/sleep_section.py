"""A model's `sleep:` and `wake:` (servers that can free their GPU memory without exiting, as vLLM's sleep
mode does) and the top-level `maxSleeping`.

Each call is written `METHOD PATH`, sent to the model's own server: `sleep: "POST /sleep?level=1&mode=wait"`,
`wake: "POST /wake_up"`. Both or neither: a model that can be put to sleep must be woken too.
"""

from __future__ import annotations

from llmswap.config.fields import Fields

METHODS = ("GET", "POST", "PUT")
EXAMPLE = {"sleep": '"POST /sleep?level=1&mode=wait"', "wake": '"POST /wake_up"'}


def read_sleep_calls(fields: Fields) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """(sleep, wake) as (method, path) pairs, both None unless both are written and valid."""
    calls = {key: _call(fields, key) for key in ("sleep", "wake")}
    written = [key for key in calls if fields.has(key)]
    if len(written) == 1:
        missing = "wake" if written[0] == "sleep" else "sleep"
        fields.error(written[0], f"{written[0]} needs {missing} too: a server llmswap puts to sleep must be "
                                 f"woken again; add {missing}: {EXAMPLE[missing]}, or remove {written[0]}")
        return None, None
    if calls["sleep"] is None or calls["wake"] is None:
        return None, None
    return calls["sleep"], calls["wake"]


def _call(fields: Fields, key: str) -> tuple[str, str] | None:
    if not fields.has(key):
        return None
    text = fields.text(key).strip()
    method, _, path = text.partition(" ")
    path = path.strip()
    if method.upper() not in METHODS or not path.startswith("/") or " " in path:
        fields.error(key, f"must be METHOD PATH, sent to the model's own server, such as {EXAMPLE[key]}; "
                          f"got {text!r}")
        return None
    return method.upper(), path


def read_max_sleeping(root: Fields, default: int) -> int:
    return root.integer("maxSleeping", default, minimum=0)
