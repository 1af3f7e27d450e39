"""Macros: `${name}` substitution in values, with llama-swap's ordering and typing rules.

A macro list is applied last-declared first, one macro at a time over the whole subtree, so a macro
may use the macros declared before it (their text is pasted in, then expanded by the later passes).
A value that is exactly `${name}` takes the macro's type (an int stays an int); anywhere else the
macro is pasted as text, formatted the way Go's `%v` formats it (`true`, `0.7`, `4096`).
Inside a model the list is `MODEL_ID`, `PYTHON`, then the global macros (a model macro of the same
name replaces the global in place), then the model's own macros.

`${PYTHON}` is llmswap's addition: the python running llmswap (`sys.executable`, quoted for the command
line), so a model served by a Python module (`${PYTHON} -m llmswap.demo`) runs in llmswap's own
environment whatever PATH says. A macro named PYTHON in the config replaces it, so a llama-swap file
that declares one loads unchanged.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from llmswap.config.errors import Problems
from llmswap.config.yamltree import Entry, Map, Node, Scalar, describe, walk_scalars

MACRO_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
MACRO_REFERENCE = re.compile(r"\$\{([a-zA-Z0-9_-]+)\}")
RESERVED_NAMES = ("PID", "PORT", "MODEL_ID", "KV_DIR")
MAX_NAME_LENGTH = 63
PYTHON_COMMAND = shlex.quote(sys.executable) if sys.executable else "python3"


def go_text(value: Any) -> str:
    """`value` as Go's `%v` prints it, so pasted macros read the same as under llama-swap."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        shortest = repr(value)
        exponent = Decimal(shortest).adjusted()
        if -4 <= exponent < 21:
            # Go switches to exponent form only from 1e21; Python does from 1e16 and writes 4096.0.
            plain = format(Decimal(shortest), "f")
            return plain.rstrip("0").rstrip(".") if "." in plain else plain
        return shortest
    return str(value)


@dataclass(frozen=True)
class Macro:
    name: str
    value: Any  # str, int, float or bool
    line: int

    @property
    def reference(self) -> str:
        return "${" + self.name + "}"

    @property
    def text(self) -> str:
        return go_text(self.value)


def read_macros(node: Node | None, path: str, problems: Problems) -> list[Macro]:
    """The valid macro declarations of a `macros:` mapping, in declaration order; others are reported."""
    if node is None or (isinstance(node, Scalar) and node.value is None):
        return []
    if not isinstance(node, Map):
        problems.error(node.line, path, f"must be a mapping of macro names to values, got {describe(node)}")
        return []
    macros: list[Macro] = []
    for name, entry in node.entries.items():
        where = f"{path}.{name}"
        value_node = entry.node
        if len(name) > MAX_NAME_LENGTH:
            problems.error(
                entry.key_line,
                where,
                f"macro name '{name}' exceeds maximum length of {MAX_NAME_LENGTH} characters",
            )
            continue
        if not MACRO_NAME.match(name):
            problems.error(
                entry.key_line,
                where,
                f"macro name '{name}' contains invalid characters, must match pattern ^[a-zA-Z0-9_-]+$",
            )
            continue
        if name in RESERVED_NAMES:
            problems.error(
                entry.key_line,
                where,
                f"macro name '{name}' is reserved; choose another name (PID, PORT, MODEL_ID, KV_DIR)",
            )
            continue
        if not isinstance(value_node, Scalar) or value_node.value is None:
            problems.error(
                entry.key_line,
                where,
                f"macro '{name}' has invalid type ({describe(value_node)}), "
                "must be a scalar type (string, int, float, or bool)",
            )
            continue
        macro = Macro(name, value_node.value, entry.key_line)
        if isinstance(macro.value, str) and macro.reference in macro.value:
            problems.error(entry.key_line, where, f"macro '{name}' contains self-reference")
            continue
        macros.append(macro)
    return macros


def model_scope(
    model_id: str,
    line: int,
    global_macros: Sequence[Macro],
    own: Sequence[Macro],
) -> list[Macro]:
    """The list applied inside one model: MODEL_ID, PYTHON, globals (overridden in place), then its own."""
    builtins = [Macro("MODEL_ID", model_id, line)]
    if not any(macro.name == "PYTHON" for macro in global_macros):
        builtins.append(Macro("PYTHON", PYTHON_COMMAND, line))
    scope = [*builtins, *global_macros]
    position = {macro.name: index for index, macro in enumerate(scope)}
    for macro in own:
        if macro.name in position:
            scope[position[macro.name]] = macro
        else:
            position[macro.name] = len(scope)
            scope.append(macro)
    return scope


def substitute(scalar: Scalar, macro: Macro) -> None:
    value = scalar.value
    if not isinstance(value, str) or macro.reference not in value:
        return
    if value == macro.reference:
        scalar.value = macro.value
        scalar.text = macro.text
    else:
        scalar.value = scalar.text = value.replace(macro.reference, macro.text)


def apply_macros(node: Node, macros: Sequence[Macro]) -> None:
    """Expand `macros` (last declared first) in every value under `node`."""
    scalars = [scalar for _, scalar in walk_scalars(node, "")]
    for macro in reversed(macros):
        for scalar in scalars:
            substitute(scalar, macro)


def apply_macros_to_keys(mapping: Map, macros: Sequence[Macro], path: str, problems: Problems) -> None:
    """Expand macros in the keys of `mapping` (only `setParamsByID` keys are expanded)."""
    renamed: dict[str, Entry] = {}
    for key, entry in mapping.entries.items():
        new_key = key
        for macro in reversed(macros):
            new_key = new_key.replace(macro.reference, macro.text)
        if new_key in renamed:
            problems.error(
                entry.key_line,
                f"{path}.{new_key}",
                "two keys expand to the same name "
                f"(the other is at {problems.where(renamed[new_key].key_line)})",
            )
            continue
        renamed[new_key] = Entry(new_key, entry.key_line, entry.node)
    mapping.entries = renamed


def _unresolved_message(name: str, path: str) -> str:
    if name == "PID":
        return "${PID} is only available in cmdStop (it is the upstream's process id at stop time)"
    if name == "PORT":
        return "${PORT} is only available in a model whose cmd uses ${PORT}"
    if name in ("MODEL_ID", "PYTHON") and not path.startswith("models."):
        return f"${{{name}}} is only available inside a model's settings"
    return (
        f"unknown macro '${{{name}}}'; declare it under macros: "
        "(a macro may only use macros declared before it)"
    )


def report_unresolved(node: Node, path: str, problems: Problems, *, allow_pid: bool = False) -> None:
    """One error per macro reference left under `node` after expansion."""
    for where, scalar in walk_scalars(node, path):
        if not isinstance(scalar.value, str):
            continue
        seen: set[str] = set()
        for match in MACRO_REFERENCE.finditer(scalar.value):
            name = match.group(1)
            if name in seen or (allow_pid and name == "PID"):
                continue
            seen.add(name)
            problems.error(scalar.line, where, _unresolved_message(name, where))


def report_unresolved_keys(mapping: Map, path: str, problems: Problems) -> None:
    for key, entry in mapping.entries.items():
        for match in MACRO_REFERENCE.finditer(key):
            problems.error(entry.key_line, f"{path}.{key}", _unresolved_message(match.group(1), path))
