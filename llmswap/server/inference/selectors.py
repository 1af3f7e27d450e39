"""Selectors at run time: which target a request for a selector id goes to (llama-swap's `warm`, `pin` and
`spillover`), the per-selector counts spillover needs, and the selectors' `/v1/models` records.

`choose` is pure: it reads a `TargetView` per target (the local process state and the router's
`ModelLoad`, or nothing for a peer) and the selector's outstanding counts. Because llmswap queues, a
target's state alone does not say whether it can take a request: `warm` prefers a warm target that the
router says it would take (`ModelLoad.accepts`, which counts queued requests as well as running ones and the
queue bounds), counts a target with queued requests or a load under way as warming, and only then
cold-starts the first target that would take the request.

A `SelectorBook` belongs to one config: a reload starts a new one (counts and round-robin reset). A request
holds a `SelectorHold` on its target from the choice until its response has ended, queued and streaming
included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from llmswap.config.model import Config, SelectorConfig
from llmswap.process.state import ProcessState
from llmswap.router import Router
from llmswap.scheduler.types import ModelLoad
from llmswap.server.inference.peers import resolve_peer
from llmswap.server.observe.records import plain


@dataclass(frozen=True)
class TargetView:
    """One target as a choice sees it. `load` is None for a peer target."""

    name: str  # as configured: what the request is rewritten to
    key: str  # what it resolves to: the real model id, or `<peer>/<model>`
    load: ModelLoad | None

    @property
    def accepts(self) -> bool:
        return self.load is None or self.load.accepts

    @property
    def ready(self) -> bool:
        return self.load is not None and self.load.state is ProcessState.READY

    @property
    def warming(self) -> bool:
        """Starting, or about to: a load under way or requests queued for it (the batch scheduler's turn)."""
        load = self.load
        if load is None or load.state is ProcessState.STOPPING:
            return False
        return load.state is ProcessState.STARTING or load.loading or load.waiting > 0


@dataclass(frozen=True)
class Choice:
    index: int  # into the selector's targets
    round_robin: bool = False  # a least-busy tie was broken: the selector's counter advances


class NoTarget(Exception):
    """No target can be chosen (spillover with every target stopping): answered with 503."""


def choose(selector: SelectorConfig, views: Sequence[TargetView], counts: Mapping[str, int],
           turn: int = 0) -> Choice:
    """The target for one request. `counts`: this selector's outstanding requests per target key;
    `turn`: its round-robin counter. Raises `NoTarget`."""
    if selector.strategy == "pin":
        return Choice(0)
    if selector.strategy == "warm":
        return Choice(_warm(views))
    return _spillover(selector, views, counts, turn)


def _warm(views: Sequence[TargetView]) -> int:
    for wanted in (lambda v: v.ready, lambda v: v.warming):
        for index, view in enumerate(views):
            if wanted(view) and view.accepts:
                return index
    # Nothing warm can take it: cold-start the first target that would take it (targets[0] when
    # nothing is full); when none would, targets[0] answers with its refusal.
    for index, view in enumerate(views):
        if view.accepts and not view.ready and not view.warming:
            return index
    return 0


def _spillover(selector: SelectorConfig, views: Sequence[TargetView], counts: Mapping[str, int],
               turn: int) -> Choice:
    active: list[int] = []
    cold: list[int] = []
    for index, view in enumerate(views):
        count = counts.get(view.key, 0)
        if view.load is None:
            (active if count > 0 else cold).append(index)
        elif view.load.state is ProcessState.STOPPING:
            continue
        elif view.ready or view.warming or count > 0:
            active.append(index)
        else:
            cold.append(index)
    if not active and not cold:
        raise NoTarget(f'selector "{selector.id}" has no available spillover targets')
    if not active:
        return Choice(cold[0])
    room = [i for i in active if counts.get(views[i].key, 0) < selector.spillover and views[i].accepts]
    if room:
        return _least_busy(room, views, counts, turn)
    if cold:
        return Choice(cold[0])
    return _least_busy(active, views, counts, turn)


def _least_busy(indexes: list[int], views: Sequence[TargetView], counts: Mapping[str, int],
                turn: int) -> Choice:
    fewest = min(counts.get(views[i].key, 0) for i in indexes)
    tied = [i for i in indexes if counts.get(views[i].key, 0) == fewest]
    if len(tied) == 1:
        return Choice(tied[0])
    return Choice(tied[turn % len(tied)], round_robin=True)


# ------------------------------------------------------------------------------------------ state


def target_key(config: Config, name: str) -> tuple[str, bool]:
    """(what `name` resolves to, whether it is local): a model id, or `<peer>/<model>`."""
    real = config.real_model_name(name)
    if real is not None:
        return real, True
    peer = resolve_peer(config, name)
    if peer is not None:
        return f"{peer[0].id}/{peer[1]}", False
    return name, False


def views_of(config: Config, router: Router, selector: SelectorConfig) -> list[TargetView]:
    views = []
    for name in selector.targets:
        key, local = target_key(config, name)
        load = router.load_of(key) if local else None
        if local and load is None:  # a router that does not handle it: seen as stopped, taking nothing
            load = ModelLoad(ProcessState.STOPPED, accepts=False)
        views.append(TargetView(name, key, load))
    return views


@dataclass
class SelectorBook:
    """Outstanding requests per selector and target, and each selector's round-robin counter."""

    config: Config
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)

    def pick(self, router: Router, selector: SelectorConfig) -> SelectorHold:
        """Choose a target and hold it: the count rises now, in the same step as the choice."""
        views = views_of(self.config, router, selector)
        counts = self.counts.setdefault(selector.id, {})
        choice = choose(selector, views, counts, self.turns.get(selector.id, 0))
        if choice.round_robin:
            self.turns[selector.id] = self.turns.get(selector.id, 0) + 1
        view = views[choice.index]
        counts[view.key] = counts.get(view.key, 0) + 1
        return SelectorHold(self, selector.id, view.name, view.key)

    def outstanding(self, selector_id: str) -> dict[str, int]:
        return dict(self.counts.get(selector_id, {}))


@dataclass
class SelectorHold:
    """One request's hold on its target; `release` (once) when its response has ended."""

    book: SelectorBook
    selector: str
    target: str  # the configured target name the request now carries
    key: str
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        counts = self.book.counts.get(self.selector, {})
        left = counts.get(self.key, 0) - 1
        if left > 0:
            counts[self.key] = left
        else:
            counts.pop(self.key, None)


# ------------------------------------------------------------------------------------------ listing


def selector_records(config: Config, router: Router, created: int) -> list[dict[str, Any]]:
    """`/v1/models` records of the listed selectors, shaped as llama-swap lists them."""
    records = []
    for selector in config.selectors.values():
        if selector.unlisted:
            continue
        looked = selector.targets[:1] if selector.strategy == "pin" else selector.targets
        loaded = False
        for name in looked:
            key, local = target_key(config, name)
            state = router.model_state(key) if local else None
            loaded = loaded or state in (ProcessState.READY, ProcessState.STARTING)
        own: dict[str, Any] = {**plain(selector.metadata), "type": "selector", "strategy": selector.strategy,
                               "targets": list(selector.targets)}
        if selector.strategy == "spillover":
            own["spillover"] = selector.spillover
        record: dict[str, Any] = {"id": selector.id, "object": "model", "created": created,
                                  "owned_by": "llmswap"}
        if selector.name:
            record["name"] = selector.name
        if selector.description:
            record["description"] = selector.description
        record["meta"] = {"llamaswap": own}
        record["status"] = {"value": "loaded" if loaded else "unloaded"}
        records.append(record)
    return records


class Selectors:
    """The live config's `SelectorBook`: a reloaded config starts a new one (its counts reset)."""

    def __init__(self) -> None:
        self._book: SelectorBook | None = None

    def book(self, config: Config) -> SelectorBook:
        book = self._book
        if book is None or book.config is not config:
            book = self._book = SelectorBook(config)
        return book


SELECTORS: web.AppKey[Selectors] = web.AppKey("llmswap_selectors", Selectors)
