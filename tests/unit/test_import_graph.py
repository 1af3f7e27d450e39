"""The import graph of `llmswap/` has no cycle, between modules or between packages.

Every import counts: module level, inside functions, and under `TYPE_CHECKING` alike, since each one is a
dependency a reader has to hold in mind. Packages are the first level below `llmswap` (`llmswap.server`,
`llmswap.tasks`, ...): the layers of ARCHITECTURE.md, which import one way only, down.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import llmswap

ROOT = Path(llmswap.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(module: str, path: Path) -> Iterator[str]:
    """Every dotted name `module` imports, relative imports made absolute."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            # `from pkg import name` may import the module pkg.name, or a name defined in pkg.
            yield from (f"{base}.{alias.name}" for alias in node.names)


def module_graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imported in _imported(name, path):
            target = owner(imported) if imported.startswith("llmswap.") else None
            if target is not None and target != name:
                graph[name].add(target)
    return graph


def package_graph(modules: Mapping[str, set[str]]) -> dict[str, set[str]]:
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for module, targets in modules.items():
        for target in targets:
            if package(module) != package(target):
                graph.setdefault(package(module), set()).add(package(target))
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_loop_and_ignores_a_chain() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


def test_no_import_cycle_between_modules() -> None:
    assert cycles(module_graph()) == []


def test_no_import_cycle_between_packages() -> None:
    assert cycles(package_graph(module_graph())) == []


def test_the_graph_sees_function_level_imports() -> None:
    # cli/main.py builds the server inside a function: a walk of module-level imports alone would miss it.
    assert "llmswap.server.lifecycle" in module_graph()["llmswap.cli.main"]


# ARCHITECTURE.md's layers, top to bottom: a package imports only packages below it. The demo upstream
# stands apart (it imports nothing of llmswap's but the version); `llmswap` itself holds the version.
LAYERS = (
    "llmswap.__main__",
    "llmswap.cli",
    "llmswap.server",
    "llmswap.tasks",
    "llmswap.upstream",
    "llmswap.activity",
    "llmswap.router",
    "llmswap.scheduler",
    "llmswap.process",
    "llmswap.kvcache",
    "llmswap.machine",
    "llmswap.calls",
    "llmswap.config",
    "llmswap",
)


def upward_imports(graph: Mapping[str, set[str]], layers: tuple[str, ...]) -> list[tuple[str, str]]:
    """The package imports that run up (or sideways past) the declared order; packages outside it count
    as a violation too, so a new package must be placed."""
    rank = {name: index for index, name in enumerate(layers)}
    found = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if source not in rank or target not in rank or rank[source] >= rank[target]:
                found.append((source, target))
    return found


def test_upward_imports_are_found() -> None:
    graph = {"top": {"bottom"}, "bottom": {"top"}, "new": {"bottom"}}
    assert upward_imports(graph, ("top", "bottom")) == [("bottom", "top"), ("new", "bottom")]


def test_packages_import_only_the_layers_below_them() -> None:
    graph = package_graph(module_graph())
    graph.pop("llmswap.demo", None)  # a standalone upstream for examples and tests
    assert upward_imports(graph, LAYERS) == []


def test_no_module_is_over_600_lines() -> None:
    """One idea a module: past 600 lines a module holds two (the shape ARCHITECTURE.md asks for)."""
    long = {str(path.relative_to(ROOT.parent)): n for path in ROOT.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 600}
    assert long == {}


def test_no_class_of_the_router_or_the_scheduler_is_built_from_two() -> None:
    """A router or scheduler object is composed of collaborators with explicit constructor arguments, not
    assembled from mixins whose halves declare each other's private state."""
    mixed = []
    for module, path in _modules().items():
        if not module.startswith(("llmswap.router", "llmswap.scheduler")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and len(node.bases) > 1:
                mixed.append(f"{module}.{node.name}({', '.join(ast.unparse(b) for b in node.bases)})")
    assert mixed == []
