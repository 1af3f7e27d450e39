"""Config reload without a restart: a successor router adopts the live processes of unchanged models.

llama-swap rebuilds everything on reload and every model starts cold. Here `successor_router(old, config)`
builds the new router so that each model whose `ModelConfig` did not change keeps its very `Process` (same
child, same PID, still loaded), then retires `old` through one `Handover`:

- from that instant the old router takes no decision: its waiters, and any request that still reaches it,
  wait on the successor instead (`Rerouted`, caught in `Router.acquire`);
- requests the old router already granted finish on it, undisturbed;
- the processes it keeps (changed and removed models) are shut down at once — llama-swap's unload semantics,
  in-flight requests on them are cut — and the successor starts nothing until they are gone, so a
  replacement never races its predecessor for a port or for memory;
- while the old router still serves an adopted model, the successor may not evict it: the eviction waits for
  those requests, as it would for its own (`before_evict`);
- a swap the old router had under way keeps going; until it is done the successor sees its target as
  starting and its victims as stopping (`claim`), so it never grants a model that is about to be stopped nor
  ignores one that is about to run;
- requests the old router still serves count toward the successor's `concurrencyLimit` (and its in-flight
  gauge): `Router.inherited_in_flight`; what the old scheduler measured of the adopted models' service
  and load times carries over;
- once the old router is idle its run loop ends and the successor forgets it (`done`).

Reloads may chain (a second one before the first has drained): every question is also put to the
predecessor's own handover.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmswap.config.model import Config, ModelConfig
from llmswap.process import Process
from llmswap.process.state import ProcessState
from llmswap.router.types import ProcessEventSink, ProcessFactory, ProcessLike
from llmswap.scheduler.estimates import ServiceTimes

if TYPE_CHECKING:
    from llmswap.router.router import Router

log = logging.getLogger("llmswap.router.handover")


def same_model(old: ModelConfig, new: ModelConfig) -> bool:
    """Whether a running process of `old` can serve as `new`: equal settings (its line may have moved)."""
    return dataclasses.replace(old, line=0) == dataclasses.replace(new, line=0)


def adoptable(old: Config, new: Config) -> frozenset[str]:
    """Ids of the models `new` keeps exactly as `old` had them."""
    return frozenset(
        mid for mid, model in new.models.items() if mid in old.models and same_model(old.models[mid], model)
    )


RouterBuilder = Callable[..., "Router"]


def successor_router(
    old: Router,
    config: Config,
    *,
    build: RouterBuilder | None = None,
    process_factory: ProcessFactory | None = None,
) -> Router:
    """Build the router for `config`, adopting `old`'s processes of unchanged models, and retire `old`.

    Not started: call `start()` on the result (and put it where requests find it) before awaiting
    anything, so the requests `old` hands over are decided promptly. `build` defaults to `build_router`;
    `process_factory` makes the processes of new and changed models (default: a real `Process`).
    """
    if old.retired or old.closing:
        raise RuntimeError(f"router {old.name} is already retired or shutting down")
    if build is None:
        from llmswap.router import build_router

        build = build_router
    adopted = adoptable(old.config, config)
    ring = old.upstream_log

    def make(model: ModelConfig, on_event: ProcessEventSink) -> ProcessLike:
        if model.id in adopted:
            return old.processes[model.id]
        if process_factory is not None:
            return process_factory(model, on_event)
        return Process(model, on_event=on_event, mirror=ring, kv=old.kv)

    new = build(config, process_factory=make)
    new.upstream_log = ring  # one combined upstream log across reloads: its tail stays continuous
    new.kv = old.kv  # what `kvCache.save: auto` learned stays learned; a restore under way stays protected
    _carry_estimates(old, new, adopted)
    for observer in old.observers:
        new.add_observer(observer)
    handover = Handover(old, new, adopted)
    if old.succession.retired:
        raise RuntimeError(f"{old.name}: already handed over")
    old.succession.link(outgoing=handover)
    new.succession.link(incoming=handover)
    old.retire()
    handover.begin()
    kept = sorted(adopted)
    dropped = sorted(set(old.processes) - adopted)
    log.debug("reload: %s adopts the processes of %s; %s are stopped by the old router", new.name,
              ", ".join(kept) or "no model", ", ".join(dropped) or "none")
    return new


def _carry_estimates(old: Router, new: Router, adopted: frozenset[str]) -> None:
    """What the old scheduler learned about the kept models' service and load times (Retry-After, batch
    planning) stays true of the same processes, so the new scheduler starts from it, not from defaults."""
    old_times = getattr(old.scheduler, "times", None)
    new_times = getattr(new.scheduler, "times", None)
    if isinstance(old_times, ServiceTimes) and isinstance(new_times, ServiceTimes):
        new_times.adopt(old_times, adopted)


class Handover:
    """One retirement: `old` winding down beside `new`, which adopted the processes in `adopted`."""

    def __init__(self, old: Router, new: Router, adopted: frozenset[str]) -> None:
        self.old = old
        self.new = new
        self.successor = new
        self.adopted = adopted
        self.replaced = tuple(mid for mid in old.processes if mid not in adopted)
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = loop.create_future()
        self._change = asyncio.Event()
        self._teardown: asyncio.Task[None] | None = None
        self._replaced_gone = False

    def begin(self) -> None:
        """Shut down the processes the successor did not adopt (called once `old` is retired)."""
        self._teardown = asyncio.get_running_loop().create_task(
            self._tear_down(), name=f"handover:{self.old.name}"
        )

    async def _tear_down(self) -> None:
        processes = [self.old.processes[mid] for mid in self.replaced]
        # shutdown(), not stop(): a swap the old router still runs must never start them again.
        results = await asyncio.gather(
            *(p.shutdown(p.config.unload_timeout) for p in processes), return_exceptions=True
        )
        for process, result in zip(processes, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("reload: stopping the old %s failed: %r", process.id, result)
        self._replaced_gone = True
        self.changed()

    # ------------------------------------------------------------------ questions from the successor

    def claim(self, model: str) -> ProcessState | None:
        """The state the old routers' unfinished swaps give an adopted process, or None."""
        if model not in self.adopted:
            return None
        claimed = self.old.swap_claims().get(model)
        if claimed is None and self.old.succession.incoming is not None:
            claimed = self.old.succession.incoming.claim(model)
        return claimed

    def serving(self, model: str) -> int:
        """Responses the old routers still stream from an adopted process."""
        if model not in self.adopted:
            return 0
        count = self.old.serving(model)
        if self.old.succession.incoming is not None:
            count += self.old.succession.incoming.serving(model)
        return count

    def inherited_in_flight(self, model: str) -> int:
        """Requests of `model` the old routers still count in flight (every router still winding down)."""
        return self.old.serving(model) + self.old.succession.inherited_in_flight(model)

    def torn_down(self) -> bool:
        """Whether every process the old routers kept is gone."""
        if not self._replaced_gone:
            return False
        incoming = self.old.succession.incoming
        return incoming is None or (isinstance(incoming, Handover) and incoming.torn_down())

    async def shut_down_predecessors(self, timeout: float | None) -> None:
        """The successor shuts down: the old router (and any older one) goes with it."""
        if not self.old.closing:
            await self.old.shutdown(timeout)

    async def before_start(self) -> None:
        """Wait until the successor may start a process: the replaced ones are gone."""
        await self._until(self.torn_down)

    async def before_evict(self, model: str) -> None:
        """Wait until the successor may stop `model`: the old routers no longer stream from it."""
        await self._until(lambda: self.serving(model) == 0)

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._change.wait()

    # ------------------------------------------------------------------ progress

    def changed(self) -> None:
        """Something the successor may wait on moved: wake its waits and its scheduler; maybe finish."""
        event, self._change = self._change, asyncio.Event()
        event.set()
        self.new.poke()
        self._finish_if_idle()
        self.new.succession.progress()  # the successor was retired too: its handover may move

    def _finish_if_idle(self) -> None:
        # An older router still winding down is reached only through `old`: keep `old` until it is gone.
        if self.done.done() or self.old.busy or not self.torn_down() or self.old.succession.incoming:
            return
        self.old.finish_loop()
        self.new.succession.unlink(self)
        self.done.set_result(None)
        log.info("reload: the previous router %s has finished its last request", self.old.name)

    async def wait_done(self, timeout: float | None = None) -> None:
        """Return once the old router is idle and its loop has ended; TimeoutError after `timeout` s."""
        await asyncio.wait_for(asyncio.shield(self.done), timeout)
