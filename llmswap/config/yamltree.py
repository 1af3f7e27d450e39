"""The config file as a tree of YAML values that remember their line.

PyYAML's node API (`yaml.compose`) keeps a position for every value; this module turns those nodes
into `Scalar`/`Seq`/`Map` values that macros can rewrite in place while messages still point at the
line the user wrote. Scalars are typed with YAML 1.2's core schema, as llama-swap's Go YAML library
does, so `on`/`yes` stay text and `1:30` is not a number. Merge keys (`<<: *base`) and anchors are
expanded, with a bound so a few aliases cannot blow a small file up into millions of values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.reader import ReaderError

from llmswap.config.errors import ConfigError, Problems, in_file_order

MAX_DEPTH = 100
MAX_VALUES = 100_000

_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"


class _CoreSchemaLoader(yaml.SafeLoader):
    """Resolves plain scalars with YAML 1.2's core schema instead of PyYAML's YAML 1.1 rules."""

    yaml_implicit_resolvers: dict[Any, Any] = {}


_CoreSchemaLoader.add_implicit_resolver(_NULL, re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
_CoreSchemaLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_CoreSchemaLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?[0-9][0-9_]*|[-+]?0x[0-9a-fA-F_]+|[-+]?0o[0-7_]+|[-+]?0b[01_]+)$"),
    list("-+0123456789"),
)
_CoreSchemaLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
_CoreSchemaLoader.add_implicit_resolver(_MERGE, re.compile(r"^<<$"), ["<"])


@dataclass(eq=False)
class Scalar:
    """A YAML scalar. `value` is typed (None, bool, int, float or str); `text` is what a text field reads."""

    value: Any
    text: str
    line: int


@dataclass(eq=False)
class Seq:
    items: list[Node]
    line: int


@dataclass(eq=False)
class Entry:
    """One `key: value` pair of a mapping; `key_line` is where the key was written."""

    key: str
    key_line: int
    node: Node


@dataclass(eq=False)
class Map:
    entries: dict[str, Entry] = field(default_factory=dict)
    line: int = 0

    def get(self, key: str) -> Node | None:
        entry = self.entries.get(key)
        return entry.node if entry else None


Node = Scalar | Seq | Map


def parse_int(text: str) -> int:
    """An integer in the core schema's forms (decimal, 0x, 0o, 0b; `_` separators allowed)."""
    body = text.replace("_", "")
    sign = -1 if body.startswith("-") else 1
    body = body.lstrip("+-")
    for prefix, base in (("0x", 16), ("0o", 8), ("0b", 2)):
        if body.startswith(prefix):
            return sign * int(body[2:], base)
    return sign * int(body, 10)


def parse_float(text: str) -> float:
    lowered = text.lower()
    if lowered in (".inf", "+.inf"):
        return float("inf")
    if lowered == "-.inf":
        return float("-inf")
    if lowered == ".nan":
        return float("nan")
    return float(text.replace("_", ""))


_TRUE_WORDS = frozenset({"true", "yes", "y", "on"})
_FALSE_WORDS = frozenset({"false", "no", "n", "off"})


def parse_bool_word(text: str) -> bool | None:
    """True/False for the words YAML 1.1 and 1.2 accept as booleans (any case), else None."""
    lowered = text.strip().lower()
    if lowered in _TRUE_WORDS:
        return True
    if lowered in _FALSE_WORDS:
        return False
    return None


def describe(node: Node | None) -> str:
    """A short rendering of a value for messages: `"abc"`, `5`, `true`, `a mapping`, `a list`."""
    if node is None:
        return "nothing"
    if isinstance(node, Map):
        return "a mapping"
    if isinstance(node, Seq):
        return "a list"
    value = node.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return '"' + shown.replace("\n", "\\n") + '"'
    return node.text


def to_python(node: Node) -> Any:
    """Plain dicts, lists and scalars (for free-form values such as metadata and setParams)."""
    if isinstance(node, Map):
        return {key: to_python(entry.node) for key, entry in node.entries.items()}
    if isinstance(node, Seq):
        return [to_python(item) for item in node.items]
    return node.value


def walk_scalars(node: Node, path: str) -> Iterator[tuple[str, Scalar]]:
    """Every scalar under `node`, with its key path (`a.b[2].c`)."""
    if isinstance(node, Map):
        for key, entry in node.entries.items():
            yield from walk_scalars(entry.node, f"{path}.{key}" if path else key)
    elif isinstance(node, Seq):
        for index, item in enumerate(node.items):
            yield from walk_scalars(item, f"{path}[{index}]")
    else:
        yield path, node


def parse_document(text: str, problems: Problems) -> Map:
    """Compose `text` and convert it; YAML syntax errors stop the load (with every problem so far)."""
    try:
        root = yaml.compose(text, Loader=_CoreSchemaLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if exc.context_mark and exc.problem and "end of stream" in exc.problem:
            mark = exc.context_mark  # an unclosed quote: where it opened, not the end of the file
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            where = (
                f" at line {exc.context_mark.line + 1}"
                if exc.context_mark and exc.context_mark is not mark
                else ""
            )
            what = f"{what} ({exc.context}{where})"
        problems.error(line, "", f"invalid YAML: {what}")
        raise ConfigError(in_file_order(problems.errors)) from None
    except ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        problems.error(
            line, "", f"invalid YAML: unacceptable character #x{code:04x} ({exc.reason}); remove it"
        )
        raise ConfigError(in_file_order(problems.errors)) from None
    except yaml.YAMLError as exc:
        problems.error(None, "", f"invalid YAML: {exc}")
        raise ConfigError(in_file_order(problems.errors)) from None
    except RecursionError:
        problems.error(None, "", f"invalid YAML: values are nested too deeply (the limit is {MAX_DEPTH})")
        raise ConfigError(in_file_order(problems.errors)) from None
    if root is None:
        return Map(line=1)
    converter = _Converter(problems)
    tree = converter.convert(root, "", 0)
    if converter.too_big:
        raise ConfigError(in_file_order(problems.errors))
    if not isinstance(tree, Map):
        problems.error(
            tree.line,
            "",
            f"the top level must be a mapping of settings (models:, macros:, ...), got {describe(tree)}",
        )
        raise ConfigError(in_file_order(problems.errors))
    return tree


class _Converter:
    """PyYAML nodes -> Scalar/Seq/Map, reporting duplicate keys, alias loops and oversized expansions."""

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        self.count = 0
        self.too_big = False
        self.active: set[int] = set()  # nodes being converted: meeting one again means an alias loop

    def convert(self, node: yaml.Node, path: str, depth: int) -> Node:
        line = node.start_mark.line + 1
        self.count += 1
        if self.count > MAX_VALUES or depth > MAX_DEPTH:
            if not self.too_big:
                self.too_big = True
                limit = (
                    f"more than {MAX_VALUES} values (check YAML aliases)"
                    if self.count > MAX_VALUES
                    else f"values nested more than {MAX_DEPTH} levels deep"
                )
                self.problems.error(line, path, f"the document has {limit}")
            return Scalar(None, "", line)
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path, line)
        if id(node) in self.active:
            self.problems.error(
                line, path, "a YAML alias refers to a value that contains it; remove the loop"
            )
            return Scalar(None, "", line)
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                items = [self.convert(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(node.value)]
                return Seq(items, line)
            assert isinstance(node, yaml.MappingNode)  # the one kind of node left
            return self._mapping(node, path, depth, line)
        finally:
            self.active.discard(id(node))

    def _scalar(self, node: yaml.ScalarNode, path: str, line: int) -> Scalar:
        text = node.value
        tag = node.tag
        try:
            if tag == _NULL:
                return Scalar(None, "", line)
            if tag == _BOOL:
                word = parse_bool_word(text)
                if word is None:
                    raise ValueError(text)
                return Scalar(word, text, line)
            if tag == _INT:
                return Scalar(parse_int(text), text, line)
            if tag == _FLOAT:
                return Scalar(parse_float(text), text, line)
        except ValueError:
            self.problems.error(line, path, f"{text!r} is not a valid {tag.rsplit(':', 1)[-1]}")
        return Scalar(text, text, line)

    def _mapping(self, node: yaml.MappingNode, path: str, depth: int, line: int) -> Map:
        explicit: dict[str, Entry] = {}
        merged: dict[str, Entry] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == _MERGE:
                for source in self._merge_sources(value_node, path, depth, key_line):
                    for key, entry in source.entries.items():
                        merged.setdefault(key, entry)  # the first merged mapping wins
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.error(key_line, path, "mapping keys must be plain text, not lists or mappings")
                continue
            key = key_node.value
            child_path = f"{path}.{key}" if path else key
            if key in explicit:
                first = explicit[key].key_line
                self.problems.error(
                    key_line, child_path, f"duplicate key (first at line {first}); keep only one of them"
                )
                continue
            explicit[key] = Entry(key, key_line, self.convert(value_node, child_path, depth + 1))
        entries = {key: entry for key, entry in merged.items() if key not in explicit}
        entries.update(explicit)
        return Map(entries, line)

    def _merge_sources(self, value: yaml.Node, path: str, depth: int, line: int) -> list[Map]:
        sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
        maps: list[Map] = []
        for source in sources:
            converted = self.convert(source, path, depth + 1)
            if isinstance(converted, Map):
                maps.append(converted)
            else:
                self.problems.error(
                    line, path, "a merge key (<<) must refer to a mapping or a list of mappings"
                )
        return maps
