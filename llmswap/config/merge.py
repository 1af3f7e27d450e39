"""Merging parsed config files into one tree, by llama-swap's rules for `-config` plus `-config-dir`.

    mappings         merge key by key, recursively
    lists            concatenate (the earlier file's items first): apiKeys, preload, ignorePaths, ...
    single values    must agree across files (same type and value); a null yields to the other side
    entities         each child of `models`, `groups`, `profiles`, `selectors`, `peers`, `matrix` and
                     `routing.router.settings.{groups,matrix}` names one thing, defined in one file only

A conflict is reported at the later file's line and names the earlier file's line, and merging goes on
so that one run lists every conflict. The trees must already be numbered across files
(`llmswap.config.errors.Problems.sources`), so `problems.where` can name the other file.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmswap.config.errors import Problems
from llmswap.config.yamltree import Entry, Map, Node, Scalar, Seq, describe

ENTITY_SECTIONS = frozenset(
    {
        "models",
        "groups",
        "profiles",
        "selectors",
        "peers",
        "matrix",
        "routing.router.settings.groups",
        "routing.router.settings.matrix",
    }
)


def renumber(node: Node, offset: int) -> None:
    """Shift every line under `node` by `offset` (to number a file's lines after the files before it)."""
    seen: set[int] = set()
    stack: list[Node] = [node]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.line += offset
        if isinstance(current, Map):
            for entry in current.entries.values():
                entry.key_line += offset
                stack.append(entry.node)
        elif isinstance(current, Seq):
            stack.extend(current.items)


def merge_trees(trees: Iterable[Map], problems: Problems) -> Map:
    """One tree holding every file's settings, in file order; conflicts go to `problems`."""
    merged = Map(line=1)
    for tree in trees:
        _merge_mapping(merged, tree, "", problems)
    return merged


def _merge_mapping(into: Map, other: Map, path: str, problems: Problems) -> None:
    for key, entry in other.entries.items():
        child = f"{path}.{key}" if path else key
        existing = into.entries.get(key)
        if existing is None:
            into.entries[key] = entry
        elif child in ENTITY_SECTIONS and isinstance(existing.node, Map) and isinstance(entry.node, Map):
            _merge_entities(existing.node, entry.node, child, problems)
        else:
            _merge_value(into, existing, entry, child, problems)


def _merge_entities(into: Map, other: Map, path: str, problems: Problems) -> None:
    for name, entry in other.entries.items():
        existing = into.entries.get(name)
        if existing is None:
            into.entries[name] = entry
            continue
        problems.error(
            entry.key_line,
            f"{path}.{name}",
            f"{path} entry {name!r} is already defined at {problems.where(existing.key_line)}; "
            "define it in one file only (entries of this section are not merged)",
        )


def _merge_value(into: Map, existing: Entry, entry: Entry, path: str, problems: Problems) -> None:
    ours, theirs = existing.node, entry.node
    if _is_null(theirs):
        return
    if _is_null(ours):
        into.entries[entry.key] = entry
        return
    if isinstance(ours, Map) and isinstance(theirs, Map):
        _merge_mapping(ours, theirs, path, problems)
        return
    if isinstance(ours, Seq) and isinstance(theirs, Seq):
        ours.items = [*ours.items, *theirs.items]
        return
    if isinstance(ours, Scalar) and isinstance(theirs, Scalar) and _same(ours, theirs):
        return
    problems.error(
        entry.key_line,
        path,
        f"conflicts with {problems.where(existing.key_line)}: {describe(theirs)} here, {describe(ours)} "
        "there; set it in one file only (across files, mappings merge and lists join, other values "
        "must be equal)",
    )


def _is_null(node: Node) -> bool:
    return isinstance(node, Scalar) and node.value is None


def _same(one: Scalar, other: Scalar) -> bool:
    return type(one.value) is type(other.value) and one.value == other.value
