"""Request-body filters: `useModelName`, `stripParams`, `setParams`, `setParamsByID` applied to a JSON body.

Pure functions over an already parsed JSON object; the caller decides whether the body is JSON and whether
to re-serialize (only when something changed, so an untouched body is forwarded byte for byte).

Parameter names are paths in the style of llama-swap's sjson: `a.b` addresses the field `b` of the object
`a`, a numeric segment indexes an existing array, `-1` appends to one, and `\\.` is a literal dot. Setting
a path creates the objects it goes through; stripping a path that is not there does nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmswap.config.model import Filters, ModelConfig


@dataclass(frozen=True)
class FilterPlan:
    """What to do to one request's body, resolved from the model (or peer) the request names."""

    model: str | None = None  # the `model` value to send instead of the client's (useModelName, peer name)
    strip: tuple[str, ...] = ()
    set: tuple[tuple[str, Any], ...] = ()  # in application order: setParams then setParamsByID

    @property
    def empty(self) -> bool:
        return self.model is None and not self.strip and not self.set


EMPTY_PLAN = FilterPlan()


def plan_for(filters: Filters, requested: str, *, model: str | None = None) -> FilterPlan:
    """The plan llama-swap applies: rewrite `model`, strip, then setParams (sorted keys), then the
    `setParamsByID` entry of the name the client sent (sorted keys), which may override setParams.

    Worked out per request: a model without filters gets `EMPTY_PLAN` at once; one with filters takes about
    3 us here (three keys; a cache lookup 0.1 us), against the milliseconds the proxy adds to a request,
    too little for a cache kept across requests and reloads."""
    if not model and not filters.strip_params and not filters.set_params and not filters.set_params_by_id:
        return EMPTY_PLAN
    sets: list[tuple[str, Any]] = [(key, filters.set_params[key]) for key in sorted(filters.set_params)]
    by_id = filters.set_params_by_id.get(requested, {})
    sets += [(key, by_id[key]) for key in sorted(by_id) if key != "model"]
    strip = tuple(param for param in filters.strip_params if param != "model")
    return FilterPlan(model=model or None, strip=strip, set=tuple((k, v) for k, v in sets if k != "model"))


def local_plan(model: ModelConfig, requested: str) -> FilterPlan:
    """The plan for a request to one of our own models, which the client named `requested`."""
    return plan_for(model.filters, requested, model=model.use_model_name or None)


def apply_plan(body: Mapping[str, Any], plan: FilterPlan) -> tuple[dict[str, Any], bool]:
    """The filtered body and whether it differs from `body` (which is never modified)."""
    result: dict[str, Any] = dict(body)
    if plan.empty:
        return result, False
    # Only the containers a path walks through are copied, so a large untouched field (an image,
    # a long message list) is shared with the original rather than duplicated.
    if plan.model is not None:
        result["model"] = plan.model
    for path in plan.strip:
        delete_path(result, split_path(path))
    for path, value in plan.set:
        set_path(result, split_path(path), copy.deepcopy(value))
    return result, result != body


def split_path(path: str) -> list[str]:
    """`a.b\\.c` → ["a", "b.c"]."""
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in path:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ".":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if escaped:
        current.append("\\")
    parts.append("".join(current))
    return parts


def _index(container: list[Any], segment: str) -> int | None:
    try:
        index = int(segment)
    except ValueError:
        return None
    return index if 0 <= index < len(container) else None


def _child_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def set_path(target: dict[str, Any], segments: list[str], value: Any) -> None:
    """Set `value` at `segments` inside `target`, copying (not mutating) the containers on the way."""
    node: Any = target
    for depth, segment in enumerate(segments):
        last = depth == len(segments) - 1
        if isinstance(node, list):
            if segment == "-1":
                if last:
                    node.append(value)
                    return
                node.append({})
                index = len(node) - 1
            else:
                found = _index(node, segment)
                if found is None:
                    return  # sjson leaves an array alone when the index is not a number inside it
                index = found
            if last:
                node[index] = value
                return
            node[index] = _child_copy(node[index]) if isinstance(node[index], dict | list) else {}
            node = node[index]
            continue
        if last:
            node[segment] = value
            return
        child = node.get(segment)
        node[segment] = _child_copy(child) if isinstance(child, dict | list) else {}
        node = node[segment]


def delete_path(target: dict[str, Any], segments: list[str]) -> None:
    """Remove the value at `segments`; nothing happens when the path does not exist."""
    node: Any = target
    for depth, segment in enumerate(segments):
        last = depth == len(segments) - 1
        if isinstance(node, dict):
            if segment not in node:
                return
            if last:
                del node[segment]
                return
            child = node[segment]
            if not isinstance(child, dict | list):
                return
            node[segment] = _child_copy(child)
            node = node[segment]
        elif isinstance(node, list):
            index = _index(node, segment)
            if index is None:
                return
            if last:
                del node[index]
                return
            child = node[index]
            if not isinstance(child, dict | list):
                return
            node[index] = _child_copy(child)
            node = node[index]
        else:
            return
