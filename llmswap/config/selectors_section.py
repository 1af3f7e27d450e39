"""`selectors:`: virtual model ids that pick one of their targets per request (llama-swap's selectors).

A selector's id is a name clients send, so it must not mean something else already: a model id, an
alias or a fully qualified peer model name is refused. A target is a model id, an alias, `<peer>/<model>`
or a bare peer model name; never another selector (no chains). `spillover` runs its local targets side by
side, so they must be able to run together under the router in use: one group with `swap: false`, or one
expanded matrix set (the vram router decides by memory at run time, so nothing is checked for it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.model import SELECTOR_STRATEGIES, PeerConfig, RoutingConfig, SelectorConfig
from llmswap.config.yamltree import Map, to_python

SELECTOR_KEYS = keys.SELECTOR  # the keys the loader accepts here (llmswap.config.keys)


@dataclass(frozen=True)
class Names:
    """Every name a request may carry, to resolve selector targets and profile pins at load."""

    model_ids: Collection[str]
    aliases: Mapping[str, str]
    peers: Mapping[str, PeerConfig]

    def local(self, name: str) -> str | None:
        """The model id `name` refers to (an id or an alias), or None."""
        return name if name in self.model_ids else self.aliases.get(name)

    def peer(self, name: str) -> str | None:
        """The `<peer>/<model>` name `name` refers to: a full name, or a bare name one peer lists."""
        peer_id, slash, model = name.partition("/")
        if slash and peer_id in self.peers and model in self.peers[peer_id].models:
            return name
        owners = [peer.id for peer in self.peers.values() if name in peer.models]
        return f"{owners[0]}/{name}" if len(owners) == 1 else None

    def is_peer_fqn(self, name: str) -> bool:
        peer_id, slash, model = name.partition("/")
        return bool(slash) and peer_id in self.peers and model in self.peers[peer_id].models


def read_selectors(root: Fields, names: Names, routing: RoutingConfig) -> dict[str, SelectorConfig]:
    section = root.mapping("selectors", "a mapping of selector ids to selectors")
    selectors: dict[str, SelectorConfig] = {}
    for selector_id in section.names():
        key_line = section.line(selector_id)
        if not selector_id.strip():
            section.error(selector_id, "selectors: selector names cannot be empty; give the selector an id")
            continue
        fields = section.mapping(selector_id, "a mapping with strategy: and targets:")
        if not isinstance(section.map.get(selector_id), Map):
            continue
        fields.warn_unknown(keys.SELECTOR)
        ok = _check_id(fields, selector_id, names)
        strategy = fields.text("strategy").strip()
        if not strategy:
            fields.error("strategy" if "strategy" in fields.map.entries else None,
                         f"strategy is required; use one of {', '.join(SELECTOR_STRATEGIES)}")
            ok = False
        elif strategy not in SELECTOR_STRATEGIES:
            valid = ", ".join(SELECTOR_STRATEGIES)
            fields.error("strategy", f'unknown strategy "{strategy}" (valid: {valid})')
            ok = False
        settings = fields.mapping("settings", "a mapping with spillover:")
        settings.warn_unknown(keys.SPILLOVER)
        spillover = settings.integer("spillover", 1, what="a whole number of requests")
        if strategy == "spillover" and spillover < 1:
            settings.error("spillover", f"must be >= 1, got {spillover}; "
                           "it is how many requests the first target takes before the next is used")
            ok = False
        targets = fields.texts("targets", "a list of model ids, aliases or peer models")
        if not targets:
            fields.error("targets" if "targets" in fields.map.entries else None,
                         "targets must contain at least one entry; list the models to choose from")
            ok = False
        ok = _check_targets(fields, section, selector_id, strategy, targets, names, routing) and ok
        if not ok:
            continue
        selectors[selector_id] = SelectorConfig(
            id=selector_id,
            strategy=strategy,
            targets=tuple(name.strip() for name, _, _ in targets),
            spillover=spillover if strategy == "spillover" else 1,
            name=fields.text("name").strip(),
            description=fields.text("description").strip(),
            unlisted=fields.flag("unlisted", False),
            metadata=MappingProxyType(to_python(fields.mapping("metadata", "a mapping").map)),
            line=key_line,
        )
    return selectors


def _check_id(fields: Fields, selector_id: str, names: Names) -> bool:
    line, where = fields.own_line, fields.path
    if selector_id in names.model_ids:
        fields.problems.error(
            line, where, f'name conflicts with model ID "{selector_id}"; rename the selector'
        )
    elif selector_id in names.aliases:
        fields.problems.error(
            line, where,
            f'name conflicts with model alias "{selector_id}" (of {names.aliases[selector_id]}); '
            "rename the selector or the alias",
        )
    elif names.is_peer_fqn(selector_id):
        fields.problems.error(
            line, where,
            f'selector ID "{selector_id}" conflicts with fully qualified peer model name; '
            "rename the selector",
        )
    else:
        return True
    return False


def _check_targets(
    fields: Fields,
    section: Fields,
    selector_id: str,
    strategy: str,
    targets: list[tuple[str, int, str]],
    names: Names,
    routing: RoutingConfig,
) -> bool:
    ok = True
    resolved: dict[str, str] = {}  # resolved name -> the target that first named it
    local: list[str] = []
    for raw, line, where in targets:
        target = raw.strip()
        if target in section.names() and names.local(target) is None:
            fields.problems.error(
                line, where,
                f'references selector "{target}"; selector chaining is not supported: '
                f"list {target}'s targets here instead",
            )
            ok = False
            continue
        real = names.local(target)
        peer = names.peer(target) if real is None else None
        if real is None and peer is None:
            fields.problems.error(
                line, where,
                f'references unknown model "{target}"; use a model id, an alias or <peer>/<model>',
            )
            ok = False
            continue
        if strategy == "warm" and real is None:
            fields.problems.error(
                line, where,
                f'"{target}" is a peer model: it must resolve to a local model for strategy "warm" '
                "(warm reads local process states); use spillover to reach peers",
            )
            ok = False
            continue
        name = real if real is not None else str(peer)
        if strategy == "spillover" and name in resolved:
            fields.problems.error(
                line, where,
                f'targets contains duplicate resolved model "{name}" (also named by "{resolved[name]}"); '
                "remove one",
            )
            ok = False
            continue
        resolved.setdefault(name, target)
        if real is not None and real not in local:
            local.append(real)
    if ok and strategy == "spillover" and len(local) >= 2:
        problem = _cannot_run_together(local, routing)
        if problem:
            fields.error(
                "targets", f"{problem}; {selector_id}'s local targets must be able to run side by side"
            )
            ok = False
    return ok


def _cannot_run_together(local: list[str], routing: RoutingConfig) -> str:
    router = routing.router
    if router.use == "group":
        owners = {group.id for group in router.groups.values() if set(local) & set(group.members)}
        if len(owners) != 1:
            return "spillover targets must share one routing group"
        group = router.groups[owners.pop()]
        if group.swap:
            return f"spillover targets must share a group with swap: false (group {group.id} swaps)"
        return ""
    program = router.matrix.program if router.use == "matrix" and router.matrix is not None else None
    if program is not None and program.solve(local[0], local[1:]).evict:
        return "targets must all appear together in one expanded matrix set"
    return ""
