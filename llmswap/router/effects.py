"""What the router does to processes (`SwapWork`, the scheduler's `Effects`): what the scheduler may read and
do, and the slow work run off the loop.

`SwapWork` answers the scheduler: model states (as a reload's predecessor shows them, and as the router's
policy adjusts them), grants and errors (through each request's `Waiter`), the swaps in progress and the
stop tasks. `start_swap` launches a task that stops the victims, waits for the policy
(`RouterPolicy.after_evictions`) and a reload's predecessor, and starts the target (`RouterPolicy.bring_up`),
then posts `SwapDone`; `stop_processes` does the same for an unload with `StopDone`. The vram policy
waits for memory there and recovers from out-of-memory starts.

A swap is timed here, phase by phase, as it runs (`SwapPhase`): the scheduler says how long it waited for
its victims' requests to end (`SwapPlan.drain`), each victim's stop says what its save and its stop took,
the target's start what its start, restore or wake took, and the prefetch of the target's files
(`llmswap.process.prefetch`, begun by the scheduler during the drain or here as the swap starts) runs beside
them. `SwapFinished` carries the phases to the observers (metrics, events, activity), once; the requests
that waited for the swap get them with their grant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import psutil

from llmswap.config.model import Config, ModelConfig
from llmswap.process.events import LifeTimes
from llmswap.process.prefetch import Prefetch, PrefetchReport, files_named
from llmswap.process.state import RUNNING, ProcessState
from llmswap.router.policy import RouterPolicy
from llmswap.router.sleepers import host_allows_sleep, sleepers_to_stop
from llmswap.router.succession import Succession
from llmswap.router.types import (
    LoadProgress,
    ProcessLike,
    RouterEvent,
    RouterStats,
    SwapFinished,
    SwapPhase,
    SwapStarted,
    Waiter,
    phases_text,
)
from llmswap.scheduler.errors import SchedulerError, SwapFailed
from llmswap.scheduler.estimates import ServiceTimes
from llmswap.scheduler.types import Effects, HandlerRequest, Scheduler, StopDone, SwapDone, SwapPlan

log = logging.getLogger("llmswap.router")


@dataclass
class _Swap:
    plan: SwapPlan
    started: float  # the router's clock when the swap began
    task: asyncio.Task[None] | None = None
    starting: bool = False  # past the evictions: cancelling the task now aborts the target's start
    evicted: bool = False  # every victim is stopped
    aborted: bool = False
    phases: list[SwapPhase] = field(default_factory=list)  # measured so far


@dataclass
class _Prefetching:
    """A prefetch under way (or just ended) of one model's files."""

    prefetch: Prefetch
    task: asyncio.Task[PrefetchReport]
    started: float
    ended: float | None = None


class SwapWork(Effects):
    """The router's `Effects` (see the module docstring). `scheduler` is set once the router made it (the
    scheduler is built over this object)."""

    scheduler: Scheduler

    def __init__(
        self,
        name: str,
        config: Config,
        processes: dict[str, ProcessLike],
        policy: RouterPolicy,
        succession: Succession,
        stats: RouterStats,
        clock: Callable[[], float],
        post: Callable[[object], None],
        notify: Callable[[RouterEvent], None],
        closing: Callable[[], bool],
    ) -> None:
        self.name = name
        self.config = config
        self.processes = processes
        self.policy = policy
        self.succession = succession
        self.stats = stats
        self.clock = clock
        self._post = post
        self._notify = notify
        self._closing = closing
        self._swaps: dict[str, _Swap] = {}
        self._stop_tasks: set[asyncio.Task[None]] = set()
        self._unload_done: asyncio.Future[None] | None = None
        self._loads: dict[str, tuple[float, float]] = {}  # each model's last successful load: (start, ready)
        self._load_phases: dict[str, tuple[SwapPhase, ...]] = {}  # the phases of each model's last load
        self._prefetches: dict[str, _Prefetching] = {}

    @property
    def swapping(self) -> frozenset[str]:
        """The models a swap under way is for."""
        return frozenset(self._swaps)

    @contextlib.contextmanager
    def unloading(self, done: asyncio.Future[None]) -> Iterator[None]:
        """While the scheduler handles an unload: `stop_processes` resolves `done` once the processes are
        dead; if the scheduler stopped nothing, `done` is resolved as the unload is handled."""
        self._unload_done = done
        try:
            yield
        finally:
            if self._unload_done is not None:
                resolve(self._unload_done)
                self._unload_done = None

    async def wind_down(self) -> None:
        """At shutdown: cancel the swaps under way and the prefetches, and wait for them."""
        swap_tasks = [s.task for s in self._swaps.values() if s.task is not None]
        for task in swap_tasks:
            task.cancel()
        await asyncio.gather(*swap_tasks, return_exceptions=True)
        await self.stop_prefetches()

    async def stopped(self) -> None:
        """Wait for the unloads under way."""
        await asyncio.gather(*self._stop_tasks, return_exceptions=True)

    def model_state(self, model: str) -> ProcessState | None:
        process = self.processes.get(model)
        if process is None:
            return None
        state = process.state
        if self.succession.incoming is not None:
            state = self._visible_state(model, state)
        return self.policy.state_of(model, state) if self.policy.adjusts else state

    def running_models(self) -> Mapping[str, ProcessState]:
        if self.succession.incoming is None:  # every state is as the process says (the hot path)
            running = {mid: state for mid, p in self.processes.items() if (state := p.state) in RUNNING}
        else:
            states = {mid: self._visible_state(mid, p.state) for mid, p in self.processes.items()}
            running = {mid: state for mid, state in states.items() if state in RUNNING}
        return self.policy.adjust_running(running) if self.policy.adjusts else running

    def inherited_in_flight(self, model: str) -> int:
        return self.succession.inherited_in_flight(model)

    def _visible_state(self, model: str, state: ProcessState) -> ProcessState:
        return self.succession.visible_state(model, state)

    # A request's futures live in its Waiter, which answers these itself (see llmswap.router.types).

    def admit(self, req: HandlerRequest) -> bool:
        waiter: Waiter = req.handle
        return waiter.admit()

    def grant_serve(self, req: HandlerRequest, model: str) -> bool:
        waiter: Waiter = req.handle
        if not waiter.grant(model):
            return False
        load = self._loads.get(model)
        if load is not None and load[1] >= req.arrived:  # its model finished loading while it waited
            waiter.load = load[1] - max(load[0], req.arrived)
            waiter.phases = self._load_phases.get(model, ())
        if self.policy.adjusts:
            self.policy.granted(model)
        return True

    def grant_error(self, req: HandlerRequest, err: SchedulerError) -> None:
        req.handle.fail(err)

    def preempt(self, req: HandlerRequest, message: str) -> None:
        """End in-flight `req` early (preemption): cancel the task serving it, which closes its upstream
        request; `acquire` turns the cancellation into `Preempted(message)` and posts its ServeDone."""
        waiter: Waiter = req.handle
        if waiter is None or waiter.preempted is not None:
            return
        waiter.preempted = message
        log.info("%s: preempting a request of %s: %s", self.name, req.model, message)
        if waiter.task is not None and not waiter.task.done():
            waiter.task.cancel(message)

    def notify_position(self, req: HandlerRequest, position: int) -> None:
        req.handle.tell_position(position)


    def swap_claims(self) -> dict[str, ProcessState]:
        """What this router's unfinished swaps are doing to processes: the target is starting, victims
        not yet stopped are stopping. A successor reads this for the processes it adopted."""
        claims: dict[str, ProcessState] = {}
        for swap in self._swaps.values():
            if not swap.evicted:
                for victim in swap.plan.evict:
                    claims[victim] = ProcessState.STOPPING
        for model, swap in self._swaps.items():
            if not swap.aborted:
                claims.setdefault(model, ProcessState.STARTING)
        return claims

    def start_swap(self, plan: SwapPlan) -> None:
        self.stats.swaps_by_rule[plan.rule] = self.stats.swaps_by_rule.get(plan.rule, 0) + 1
        for victim in plan.evict:
            self.stats.evictions[victim] = self.stats.evictions.get(victim, 0) + 1
        swap = _Swap(plan, self.clock())
        swap.task = asyncio.get_running_loop().create_task(self._do_swap(swap), name=f"swap:{plan.model}")
        self._swaps[plan.model] = swap
        self.prefetch(plan.model)  # begun during the drain already, or now: it overlaps the stops
        self._notify(SwapStarted(plan))

    def prefetch(self, model: str) -> None:
        process = self.processes.get(model)
        if model in self._prefetches or process is None or not process.config.prefetch or \
                process.state is not ProcessState.STOPPED:
            return  # under way already, off, or nothing to read (running, or asleep: a wake reads nothing)
        files = files_named(process.config.cmd)
        if not files:
            return
        job = Prefetch(model, files)
        task = asyncio.get_running_loop().create_task(job.run(), name=f"prefetch:{model}")
        running = _Prefetching(job, task, self.clock())
        self._prefetches[model] = running
        task.add_done_callback(lambda done: self._prefetched(running, done))

    def cancel_prefetch(self, model: str) -> None:
        if model not in self._swaps:
            self._end_prefetch(model)

    async def stop_prefetches(self) -> None:
        """At shutdown: stop every read (its thread stops within a chunk) and wait for them."""
        tasks = [running.task for running in self._prefetches.values()]
        for model in list(self._prefetches):
            self._end_prefetch(model)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _end_prefetch(self, model: str) -> SwapPhase | None:
        """Stop `model`'s prefetch, if one runs; its phase (from its start to its end or now), if one ran."""
        running = self._prefetches.pop(model, None)
        if running is None:
            return None
        if not running.task.done():
            running.prefetch.cancel()
            running.task.cancel()
        return self._prefetch_phase(running)

    def _prefetch_phase(self, running: _Prefetching) -> SwapPhase:
        """A prefetch's phase: from its start to its end, or to now while it runs."""
        ended = running.ended if running.ended is not None else self.clock()
        return SwapPhase("prefetch", running.prefetch.model, ended - running.started)

    def _prefetched(self, running: _Prefetching, task: asyncio.Task[PrefetchReport]) -> None:
        running.ended = self.clock()
        if task.cancelled():
            log.info("[%s] prefetch: cancelled after %.2fs", running.prefetch.model,
                     running.ended - running.started)
            return
        error = task.exception()
        if error is not None:
            log.warning("[%s] prefetch failed: %s", running.prefetch.model, error)
            return
        report = task.result()
        log.info("[%s] prefetch: read %d MiB of %d file(s) in %.2fs%s", report.model, report.bytes >> 20,
                 len(report.read), report.seconds, " (cancelled)" if report.cancelled else "")

    def load_progress(self, model: str) -> LoadProgress | None:
        """How far a swap to `model` under way is (None when none is): its time so far against the loads
        of it measured before (the scheduler's smoothed load time, else the last load seen here)."""
        swap = self._swaps.get(model)
        if swap is None or swap.aborted:
            return None
        expected: float | None = None
        times = getattr(self.scheduler, "times", None)
        if isinstance(times, ServiceTimes) and times.observed(model)[1] > 0:
            expected = times.load(model)
        elif model in self._loads:
            start, ready = self._loads[model]
            expected = ready - start
        return LoadProgress(model, self.clock() - swap.started, expected)

    def abort_swap(self, model: str) -> None:
        swap = self._swaps.get(model)
        if swap is None or swap.aborted:
            return
        swap.aborted = True
        self._end_prefetch(model)
        # Victims being stopped are left to finish (a half-stopped process helps nobody); the swap
        # checks `aborted` before starting its target. Once starting, cancelling aborts the start.
        if swap.starting and swap.task is not None:
            swap.task.cancel()

    def stop_processes(self, models: Sequence[str], timeout: float | None) -> None:
        done, self._unload_done = self._unload_done, None
        task = asyncio.get_running_loop().create_task(self._do_stop(tuple(models), timeout, done))
        self._stop_tasks.add(task)
        task.add_done_callback(self._stop_tasks.discard)

    async def _do_swap(self, swap: _Swap) -> None:
        plan = swap.plan
        started = self.clock()
        error: SchedulerError | None = None
        target = self.processes[plan.model]
        if plan.drain is not None:
            swap.phases.extend(SwapPhase("drain", victim, plan.drain) for victim in plan.drained)
        try:
            if plan.evict:
                await asyncio.gather(*(self._evict(m, swap.phases) for m in plan.evict))
                await self._trim_sleepers(keep=plan.model)
            swap.evicted = True
            self.succession.progress()
            if plan.evict:
                await self.policy.after_evictions(plan)
            await self.succession.before_start()
            if swap.aborted:
                raise asyncio.CancelledError
            swap.starting = True
            times = await self.policy.bring_up(target)
            swap.phases.extend(_phases(plan.model, times, "start", "restore", "wake"))
        except asyncio.CancelledError:
            # Aborted because nobody waits: make sure no half-started child stays behind. (On shutdown,
            # shutdown() itself stops every process.)
            if not self._closing():
                with contextlib.suppress(Exception):
                    await asyncio.shield(target.stop())
            error = SwapFailed(f"loading {plan.model} was aborted: no request waits for it")
        except SchedulerError as exc:
            error = exc
        except Exception as exc:
            error = SwapFailed(str(exc) or type(exc).__name__)
        duration = self.clock() - started
        if error is None:
            evicted = [m + (" (asleep)" if self.processes[m].state is ProcessState.SLEEPING else "")
                       for m in plan.evict]
            shown = phases_text((*swap.phases, *self._prefetch_so_far(plan.model)))
            log.info("swap: %s ready in %.2fs (evicted %s, rule %s; %s)", plan.model, duration,
                     ", ".join(evicted) or "nothing", plan.rule, shown or "no phase measured")
        else:
            # The process logged the whole failure, with the server's last output: its first line here.
            first, *rest = str(error).splitlines() or [""]
            log.warning("swap: %s failed after %.2fs: %s%s", plan.model, duration,
                        first.removesuffix("; last output:"),
                        " (the server's last output is in the lines above)" if rest else "")
        self._post(SwapDone(plan.model, error, duration))

    def _prefetch_so_far(self, model: str) -> tuple[SwapPhase, ...]:
        running = self._prefetches.get(model)
        return () if running is None else (self._prefetch_phase(running),)

    async def _evict(self, model: str, phases: list[SwapPhase]) -> None:
        # llama-swap uses healthCheckTimeout (default 120 s) as the eviction grace; the victim's own
        # unloadTimeout is what users actually configure for "how long may it take to stop".
        await self.succession.before_evict(model)
        process = self.processes[model]
        if self._may_sleep(process.config):
            began = self.clock()
            await process.sleep(process.config.unload_timeout)  # stops it when it cannot sleep
            phases.append(SwapPhase("stop", model, self.clock() - began))  # asleep or stopped: it is gone
            return
        phases.extend(_phases(model, await process.stop(process.config.unload_timeout), "save", "stop"))

    def _may_sleep(self, model: ModelConfig) -> bool:
        if model.sleep_call is None or self.config.max_sleeping <= 0:
            return False
        memory = psutil.virtual_memory()
        if host_allows_sleep(model, memory.available, memory.total):
            return True
        log.info("%s: stopped rather than put to sleep: the host has %d MiB available", model.id,
                 memory.available >> 20)
        return False

    async def _trim_sleepers(self, keep: str) -> None:
        """Beyond `maxSleeping` models asleep, stop the ones asleep longest (never `keep`, about to wake)."""
        excess = sleepers_to_stop(self.processes, self.config.max_sleeping, keep)
        if excess:
            log.info("more than %d models asleep (maxSleeping): stopping %s", self.config.max_sleeping,
                     ", ".join(excess))
            await asyncio.gather(*(self.processes[m].stop(self.processes[m].config.unload_timeout)
                                   for m in excess))

    def finish_swap(self, ev: SwapDone) -> None:
        """A swap's `SwapDone` reached the run loop: its phases go to the observers, once."""
        swap = self._swaps.pop(ev.model, None)
        if swap is None:
            return
        prefetched = self._end_prefetch(ev.model)  # a read the start overtook is of no more use
        phases = (*swap.phases, *((prefetched,) if prefetched is not None else ()))
        if ev.error is not None:
            self.stats.swap_failures += 1
        else:
            ready = self.clock()
            self._loads[ev.model] = (ready - ev.duration, ready)
            self._load_phases[ev.model] = phases
        self._notify(SwapFinished(swap.plan, ev.error, ev.duration, phases))
        self.succession.progress()

    async def _do_stop(
        self, models: tuple[str, ...], timeout: float | None, done: asyncio.Future[None] | None
    ) -> None:
        try:
            await asyncio.gather(
                *(self.processes[m].stop(timeout) for m in models if m in self.processes),
                return_exceptions=True,
            )
        finally:
            self._post(StopDone(models))
            if done is not None:
                resolve(done)



def _phases(model: str, times: LifeTimes | None, *names: str) -> list[SwapPhase]:
    """The phases `times` measured, of those named."""
    if times is None:
        return []
    measured = asdict(times)
    return [SwapPhase(name, model, measured[name]) for name in names if measured[name] is not None]


def resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
