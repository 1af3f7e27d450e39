"""`${env.NAME}` substitution, done on the file's text before YAML parsing (as llama-swap does).

Only occurrences inside YAML scalars are replaced; one in a comment is left alone, so commented-out
settings cannot fail the load. Each value is escaped for the quoting style of the scalar it lands in,
so a `"` in a secret cannot end a double-quoted string early. Values may not contain line breaks or
NUL: they would change the file's structure (and every line number after them).

`mark_env` makes the other text a loader needs: each reference replaced by a marker instead of its value,
which travels through macros and command splitting unchanged; `written_form` turns the markers back into
`${env.NAME}`. That is how a model's command is shown as written, without the secrets it is given.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping

import yaml

from llmswap.config.errors import Problems

ENV_REFERENCE = re.compile(r"\$\{env\.([a-zA-Z_][a-zA-Z0-9_]*)\}")
# Private-use characters: nothing a user writes, and YAML takes them in any scalar style.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_MARKED = re.compile(f"{_MARK_OPEN}([a-zA-Z_][a-zA-Z0-9_]*){_MARK_CLOSE}")


def _scalar_spans(text: str) -> list[tuple[int, int, str | None]] | None:
    """(start, end, style) of every scalar token in document order, or None when the text does not scan."""
    spans: list[tuple[int, int, str | None]] = []
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if isinstance(token, yaml.ScalarToken):
                spans.append((token.start_mark.index, token.end_mark.index, token.style))
    except (yaml.YAMLError, RecursionError):
        return None
    return spans


def _escape(value: str, style: str | None) -> str:
    if style == '"':
        return value.replace("\\", "\\\\").replace('"', '\\"')
    if style == "'":
        return value.replace("'", "''")
    return value


def mark_env(text: str) -> str:
    """`text` with every `${env.NAME}` in a scalar replaced by a marker naming the variable."""
    return _replace(text, lambda name, line: f"{_MARK_OPEN}{name}{_MARK_CLOSE}")


def written_form(text: str) -> str:
    """Text loaded from `mark_env`'s output, with each marker shown as the `${env.NAME}` it stands for."""
    return _MARKED.sub(lambda match: "${env." + match.group(1) + "}", text)


def substitute_env(text: str, environ: Mapping[str, str], problems: Problems) -> str:
    """`text` with every `${env.NAME}` in a scalar replaced; unset or unusable variables become errors."""

    def value_of(name: str, line: int) -> str | None:
        value = environ.get(name)
        if value is None:
            problems.error(
                line, "", f"environment variable '{name}' is not set; export it or remove ${{env.{name}}}"
            )
            return None
        if any(ch in value for ch in "\n\r\x00"):
            problems.error(
                line,
                "",
                f"environment variable '{name}' contains newlines or NUL bytes, which cannot be "
                "substituted into YAML; use a single-line value",
            )
            return None
        return value

    return _replace(text, value_of)


def _replace(text: str, value_of: Callable[[str, int], str | None]) -> str:
    """`text` with each `${env.NAME}` in a scalar replaced by `value_of(NAME, line)` (None: left as is)."""
    if "${env." not in text:
        return text
    spans = _scalar_spans(text)
    starts = [span[0] for span in spans] if spans is not None else []
    pieces: list[str] = []
    done = 0
    for match in ENV_REFERENCE.finditer(text):
        style: str | None = None
        if spans is not None:
            # An unscannable file is searched everywhere (llama-swap's behaviour); the YAML error follows.
            index = bisect.bisect_right(starts, match.start()) - 1
            if index < 0 or not spans[index][0] <= match.start() < spans[index][1]:
                continue  # a comment, not a value
            style = spans[index][2]
        value = value_of(match.group(1), text.count("\n", 0, match.start()) + 1)
        if value is None:
            continue
        pieces.append(text[done : match.start()])
        pieces.append(_escape(value, style))
        done = match.end()
    pieces.append(text[done:])
    return "".join(pieces)
