"""Typed reads of one YAML mapping, reporting each bad value with its line and key path.

Every getter returns a usable value even when the input is wrong (the default, after recording the
error), so the loader can go on and report the other mistakes in the same run. A null value (`key:`
with nothing after it) means "not set", as it does for llama-swap's Go decoder.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection
from typing import Any

from llmswap.config.errors import Problems
from llmswap.config.sizes import parse_size
from llmswap.config.yamltree import Map, Node, Scalar, Seq, describe, parse_bool_word, parse_float, parse_int


def _number_of(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        text = value.strip()
        for parse in (parse_int, parse_float):
            try:
                return parse(text)
            except ValueError:
                continue
    return None


class Fields:
    """The keys of one mapping (`path` is its key path, e.g. `models.qwen`)."""

    def __init__(self, node: Map, path: str, problems: Problems, *, line: int | None = None) -> None:
        self.map = node
        self.path = path
        self.problems = problems
        # Where the mapping's own key was written: the line for "missing key" problems. (The node's
        # line is its first child's, one line further down.)
        self.own_line = line if line is not None else node.line

    @classmethod
    def of(cls, node: Node | None, path: str, problems: Problems, *, line: int, what: str) -> Fields:
        """`node` as a mapping; anything else but null is reported and read as an empty mapping."""
        if isinstance(node, Map):
            return cls(node, path, problems, line=line)
        if node is not None and not (isinstance(node, Scalar) and node.value is None):
            problems.error(node.line or line, path, f"must be {what}, got {describe(node)}")
        return cls(Map(line=line), path, problems, line=line)

    # --- locating ---------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self.map.entries)

    def node(self, key: str) -> Node | None:
        """The value under `key`, or None when it is missing or null."""
        entry = self.map.entries.get(key)
        if entry is None or (isinstance(entry.node, Scalar) and entry.node.value is None):
            return None
        return entry.node

    def has(self, key: str) -> bool:
        return self.node(key) is not None

    def line(self, key: str | None = None) -> int:
        if key is not None and key in self.map.entries:
            return self.map.entries[key].key_line
        return self.own_line

    def path_of(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | None, message: str) -> None:
        self.problems.error(self.line(key), self.path_of(key) if key else self.path, message)

    def warn(self, key: str | None, message: str) -> None:
        self.problems.warn(self.line(key), self.path_of(key) if key else self.path, message)

    # --- scalars ----------------------------------------------------------------------------------

    def _scalar(self, key: str, expected: str) -> Scalar | None:
        node = self.node(key)
        if node is None:
            return None
        if not isinstance(node, Scalar):
            self.error(key, f"must be {expected}, got {describe(node)}")
            return None
        return node

    def text(self, key: str, default: str = "") -> str:
        scalar = self._scalar(key, "text")
        return default if scalar is None else scalar.text

    def flag(self, key: str, default: bool) -> bool:
        scalar = self._scalar(key, "true or false")
        if scalar is None:
            return default
        if isinstance(scalar.value, bool):
            return scalar.value
        word = parse_bool_word(scalar.text) if isinstance(scalar.value, str) else None
        if word is None:
            self.error(key, f"must be true or false, got {describe(scalar)}")
            return default
        return word

    def number(
        self,
        key: str,
        default: float,
        *,
        minimum: float | None = None,
        what: str = "a number of seconds",
        accepted: str = "",
    ) -> float:
        scalar = self._scalar(key, what)
        if scalar is None:
            return default
        value = _number_of(scalar.value)
        if value is None or math.isnan(value) or math.isinf(value):
            self.error(key, f"must be {what}, got {describe(scalar)}")
            return default
        if minimum is not None and value < minimum:
            shown = int(minimum) if float(minimum).is_integer() else minimum
            more = f"; accepted: {accepted}" if accepted else ""
            self.error(key, f"must be >= {shown}, got {scalar.text.strip()}{more}")
            return default
        return float(value)

    def integer(
        self, key: str, default: int, *, minimum: int | None = None, what: str = "a whole number"
    ) -> int:
        scalar = self._scalar(key, what)
        if scalar is None:
            return default
        value = _number_of(scalar.value)
        if value is None or (isinstance(value, float) and not value.is_integer()):
            self.error(key, f"must be {what}, got {describe(scalar)}")
            return default
        value = int(value)
        if minimum is not None and value < minimum:
            self.error(key, f"must be >= {minimum}, got {value}")
            return default
        return value

    def size(self, key: str, default: int | None, *, default_unit: str = "GB") -> int | None:
        scalar = self._scalar(key, "a size such as 6.5GB")
        if scalar is None:
            return default
        raw = scalar.value if isinstance(scalar.value, int | float) else scalar.text
        try:
            return parse_size(raw, default_unit=default_unit)
        except ValueError as exc:
            self.error(key, str(exc))
            return default

    # --- containers -------------------------------------------------------------------------------

    def mapping(self, key: str, what: str = "a mapping") -> Fields:
        """The mapping under `key` (empty when missing; reported and empty when not a mapping)."""
        return Fields.of(self.node(key), self.path_of(key), self.problems, line=self.line(key), what=what)

    def items(self, key: str, what: str = "a list") -> list[Node]:
        node = self.node(key)
        if node is None:
            return []
        if not isinstance(node, Seq):
            self.error(key, f"must be {what}, got {describe(node)}")
            return []
        return node.items

    def texts(self, key: str, what: str = "a list of names") -> list[tuple[str, int, str]]:
        """(text, line, path) for each item of a list of scalars; other items are reported and skipped."""
        found: list[tuple[str, int, str]] = []
        for index, item in enumerate(self.items(key, what)):
            where = f"{self.path_of(key)}[{index}]"
            if not isinstance(item, Scalar) or item.value is None:
                self.problems.error(item.line, where, f"must be text, got {describe(item)}")
                continue
            found.append((item.text, item.line, where))
        return found

    # --- unknown keys -----------------------------------------------------------------------------

    def near_miss(self, key: str, known: Collection[str]) -> str:
        """For a missing `key`: the hint naming a key written here that is no known key and looks like it
        (`; 'command' is not a key here, did you mean 'cmd'?`), or ""."""
        unknown = [name for name in self.map.entries if name not in known]
        close = closest(key, unknown)
        return f"; '{close}' is not a key here, did you mean '{key}'?" if close else ""

    def warn_unknown(self, known: Collection[str], ignored: Collection[str] = ()) -> None:
        """A warning per key that is neither `known` nor `ignored` (keys llama-swap has, llmswap not)."""
        for key, entry in self.map.entries.items():
            if key in known or key in ignored:
                continue
            close = closest(key, known)
            hint = f"; did you mean '{close}'?" if close else ""
            self.problems.warn(entry.key_line, self.path_of(key), f"unknown key, ignored{hint}")


def closest(word: str, candidates: Collection[str]) -> str | None:
    """The candidate `word` most likely stands for: among the close ones, first one that abbreviates it or
    that it abbreviates (`command` → `cmd`, not `compat`), else the closest."""
    close = difflib.get_close_matches(word, list(candidates), n=3, cutoff=0.6)
    for candidate in close:
        if _abbreviates(candidate.lower(), word.lower()) or _abbreviates(word.lower(), candidate.lower()):
            return candidate
    return close[0] if close else None


def _abbreviates(short: str, long: str) -> bool:
    """Whether `short`'s letters appear in `long` in order."""
    letters = iter(long)
    return len(short) < len(long) and all(letter in letters for letter in short)
