"""The matrix set language: linking, validation, compilation, and the solver that picks a set.

The syntax (tree, tokenizer, parser) is `matrix_syntax`.

A matrix names the combinations of models allowed to run together. Each set is an expression:
`a & b` (both), `a | b` (either), parentheses, `+other` (inline another set), where an identifier
is a var (`vars:`) or a real model id. `&` binds tighter than `|`. The expressions are parsed once,
at config load, into a small AST whose leaves are real model ids and whose `+ref`s point at the
referenced set's tree (a DAG: shared subtrees are evaluated once per query).

Solving never expands an expression into all its combinations (a product of six ten-way choices is
a million of them): every combination is projected onto the models the query cares about (the
target and the running models), and choices that differ only outside that projection collapse to
one state. A state whose models are a subset of another's can never be cheaper (every eviction
costs at least 1), so it is dropped as soon as it is dominated.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeAlias

from llmswap.config.matrix_syntax import (
    DEFAULT_EVICT_COST,
    VAR_KEY,
    AllOf,
    AnyOf,
    Leaf,
    MatrixError,
    Node,
    Ref,
    parse_set,
    walk,
)

__all__ = [
    "DEFAULT_EVICT_COST", "AllOf", "AnyOf", "Leaf", "MatrixError", "MatrixProgram", "Node", "Ref",
    "Solution", "compile_matrix", "parse_set",
]


# --- solving -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Solution:
    """The set chosen for `target`: what may keep running beside it and what must stop."""

    set_name: str | None  # None: the target is in no set and runs alone
    members: tuple[str, ...]  # the chosen combination, sorted (the target included)
    evict: tuple[str, ...]  # running models outside it, in running order
    cost: int  # summed evict costs of `evict`
    dsl: str = ""  # the chosen set's expression as written


@dataclass(frozen=True)
class _CompiledSet:
    name: str
    dsl: str
    root: Node  # linked: only Leaf (real model ids), AllOf and AnyOf
    support: frozenset[str]  # every model the expression can mention


# A projected state: (bitmask over the query's models, witness). A witness is the combination that
# produced the state, kept as a tree (a model id, or a pair of witnesses) so it costs nothing to
# build and is flattened only for the winner.
_Witness: TypeAlias = "str | tuple[_Witness, _Witness] | None"
_State: TypeAlias = "tuple[int, _Witness]"


def _add_to_frontier(states: list[_State], mask: int, witness: _Witness) -> None:
    """Keep only undominated states, in the order they were generated (ties go to the earliest)."""
    for kept_mask, _ in states:
        if mask | kept_mask == kept_mask:
            return
    states[:] = [(m, w) for m, w in states if m | mask != mask]
    states.append((mask, witness))


class _Projection:
    """Evaluates expressions projected onto a fixed list of models; one per query."""

    def __init__(self, models: Sequence[str]) -> None:
        self.bit = {model: 1 << i for i, model in enumerate(models)}
        self._memo: dict[int, list[_State]] = {}

    def states(self, node: Node) -> list[_State]:
        cached = self._memo.get(id(node))
        if cached is not None:
            return cached
        result: list[_State]
        if isinstance(node, Leaf):
            result = [(self.bit.get(node.name, 0), node.name)]
        elif isinstance(node, AnyOf):
            result = []
            for child in node.children:
                for mask, witness in self.states(child):
                    _add_to_frontier(result, mask, witness)
        elif isinstance(node, AllOf):
            result = [(0, None)]
            for child in node.children:
                combined: list[_State] = []
                for left_mask, left_witness in result:
                    for right_mask, right_witness in self.states(child):
                        _add_to_frontier(combined, left_mask | right_mask, (left_witness, right_witness))
                result = combined
        else:  # an unlinked Ref never reaches a compiled program
            raise TypeError(f"cannot evaluate {node!r}")
        self._memo[id(node)] = result
        return result


def _flatten(witness: _Witness) -> tuple[str, ...]:
    models: set[str] = set()
    stack = [witness]
    while stack:
        current = stack.pop()
        if current is None:
            continue
        if isinstance(current, str):
            models.add(current)
        else:
            stack.extend(current)
    return tuple(sorted(models))


@dataclass(frozen=True)
class MatrixProgram:
    """A compiled matrix: immutable, shared by the config and the matrix swapper."""

    sets: tuple[tuple[str, str], ...]  # (name, expression as written), compiled order
    evict_costs: Mapping[str, int]  # real model id -> cost; absent = DEFAULT_EVICT_COST
    vars: Mapping[str, str]  # var -> real model id
    _compiled: tuple[_CompiledSet, ...] = field(default=(), repr=False, compare=False)

    def cost_of(self, model: str) -> int:
        return self.evict_costs.get(model, DEFAULT_EVICT_COST)

    def solve(self, target: str, running: Sequence[str]) -> Solution:
        """The cheapest set that can hold `target` beside the running models.

        Cost = summed evict costs of the running models left out. Ties go to the set defined first,
        then to the combination met first reading the expression left to right.
        """
        running = list(dict.fromkeys(running))
        if target in running:
            set_name, dsl = self._set_holding(running)
            return Solution(set_name, tuple(sorted(running)), (), 0, dsl)

        projection = _Projection([target, *running])
        target_bit = projection.bit[target]
        best: tuple[int, _CompiledSet, _State] | None = None
        for compiled in self._compiled:
            if target not in compiled.support:
                continue
            for state in projection.states(compiled.root):
                mask = state[0]
                if not mask & target_bit:
                    continue
                cost = sum(self.cost_of(r) for r in running if not mask & projection.bit[r])
                if best is None or cost < best[0]:
                    best = (cost, compiled, state)

        if best is None:
            cost = sum(self.cost_of(r) for r in running)
            return Solution(None, (target,), tuple(running), cost)
        cost, compiled, (mask, witness) = best
        evict = tuple(r for r in running if not mask & projection.bit[r])
        return Solution(compiled.name, _flatten(witness), evict, cost, compiled.dsl)

    def _set_holding(self, models: Sequence[str]) -> tuple[str | None, str]:
        """The first set with one combination holding every model in `models` (for logs)."""
        projection = _Projection(models)
        full = (1 << len(models)) - 1
        for compiled in self._compiled:
            if not compiled.support.issuperset(models):
                continue
            if any(mask == full for mask, _ in projection.states(compiled.root)):
                return compiled.name, compiled.dsl
        return None, ""


# --- compilation ---------------------------------------------------------------------------------


def compile_matrix(
    vars: Mapping[str, str],
    sets: Sequence[tuple[str, str]],
    evict_costs: Mapping[str, object],
    model_ids: Collection[str],
) -> MatrixProgram:
    """Validate and compile a matrix section. Raises `MatrixError` with llama-swap's wording.

    An identifier resolves to a var first, then to a model id. A set referenced with `+name` is
    placed before its first referrer, so the compiled order is definition order made topological.
    """
    if not sets:
        raise MatrixError("matrix must define at least one set")
    known_models = frozenset(model_ids)

    for key, model in vars.items():
        if not isinstance(key, str) or not VAR_KEY.fullmatch(key):
            raise MatrixError(
                f"var key \"{key}\" must contain only alphanumeric, '-' or '.' characters "
                "and be 1-32 characters long",
                ("vars", str(key)),
            )
        if not isinstance(model, str) or model not in known_models:
            raise MatrixError(f'var key "{key}" references unknown model "{model}"', ("vars", key))

    def resolve(ident: str) -> str | None:
        if ident in vars:
            return vars[ident]
        return ident if ident in known_models else None

    costs: dict[str, int] = {}
    for key, cost in evict_costs.items():
        if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
            shown = cost if isinstance(cost, int) and not isinstance(cost, bool) else repr(cost)
            raise MatrixError(
                f'evict_cost for "{key}" must be a positive integer, got {shown}', ("evict_costs", key)
            )
        resolved = resolve(key)
        if resolved is None:
            raise MatrixError(f'evict_costs: unknown var or model "{key}"', ("evict_costs", key))
        costs[resolved] = cost

    texts: dict[str, str] = {}
    for name, text in sets:
        if name in texts:
            raise MatrixError(f'set "{name}" is defined twice', ("sets", name))
        if not isinstance(text, str):
            raise MatrixError(
                f'set "{name}": expression must be a string, got {type(text).__name__}', ("sets", name)
            )
        texts[name] = text

    parsed: dict[str, Node] = {}
    refs: dict[str, list[str]] = {}
    for name, text in texts.items():
        root = parse_set(name, text)
        refs[name] = []
        for node in walk(root):
            if isinstance(node, Leaf) and resolve(node.name) is None:
                message = f'set "{name}": unknown var or model "{node.name}" at column {node.column}'
                raise MatrixError(message, ("sets", name))
            if isinstance(node, Ref):
                if node.name not in texts:
                    raise MatrixError(
                        f'set "{name}" references undefined set "{node.name}" at column {node.column}',
                        ("sets", name),
                    )
                if node.name not in refs[name]:
                    refs[name].append(node.name)
        parsed[name] = root

    order = _topological_order(list(texts), refs)

    linked: dict[str, Node] = {}

    def link(node: Node) -> Node:
        if isinstance(node, Leaf):
            resolved = resolve(node.name)
            assert resolved is not None  # every leaf was resolved above
            return Leaf(resolved, node.column)
        if isinstance(node, Ref):
            return linked[node.name]  # placed earlier by the topological order
        children = tuple(link(child) for child in node.children)
        return AllOf(children) if isinstance(node, AllOf) else AnyOf(children)

    compiled: list[_CompiledSet] = []
    for name in order:
        root = link(parsed[name])
        linked[name] = root
        support = frozenset(n.name for n in walk(root) if isinstance(n, Leaf))
        compiled.append(_CompiledSet(name, texts[name], root, support))

    return MatrixProgram(
        sets=tuple((c.name, c.dsl) for c in compiled),
        evict_costs=MappingProxyType(costs),
        vars=MappingProxyType(dict(vars)),
        _compiled=tuple(compiled),
    )


def _topological_order(names: list[str], refs: Mapping[str, list[str]]) -> list[str]:
    """Definition order, each set preceded by the sets it references (depth first)."""
    state: dict[str, str] = {}  # name -> "visiting" | "done"
    order: list[str] = []

    def visit(name: str) -> None:
        mark = state.get(name)
        if mark == "done":
            return
        if mark == "visiting":
            raise MatrixError(f'circular reference detected involving set "{name}"', ("sets", name))
        state[name] = "visiting"
        for dependency in refs[name]:
            visit(dependency)
        state[name] = "done"
        order.append(name)

    for name in names:
        visit(name)
    return order
