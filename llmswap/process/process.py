"""One upstream server process and its whole life: start, health check, serve, stop, TTL, output.

    stopped --ensure_ready--> starting --healthy--> ready --stop / ttl--> stopping --> stopped
                              starting --spawn error, premature exit, health timeout--> stopped
                              starting --stop (the start is aborted)--> stopping --> stopped
                              ready --the child exits by itself--> stopped
    any --shutdown()--> shutdown (terminal)

Each life of the child is a `Run` driven by one supervisor task, the only writer of the state while it
runs. Public methods post a request to the run (a flag plus a wake-up) and await its outcome through
`asyncio.shield`, so a caller that goes away never cancels a start or a stop others share.
`ensure_ready()` decides between "ready", "join the start", "wait for the stop, then start fresh" and
"start" in one synchronous step: no stale read can gate a start (llama-swap's #946). A `kvCache` model's
slots are restored before "ready" and saved before a stop's signal (`KvKeeper`).

Events (`ProcessEvent.kind`) are delivered synchronously from the supervisor task, in this order; every
run ends with exactly one of `start_failed`, `stopped`, `exited`:
    starting -> [kv] -> ready (duration) | start_failed (detail, exit_code) | stopping -> stopped (aborted)
    ready -> stopping -> [kv] -> stopped          a stop was asked for (kv: restore, then save)
    ready -> ttl_expired -> stopping -> stopped   idle for `ttl` seconds
    ready -> exited (exit_code, detail)           the child died by itself
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from llmswap.config.model import ModelConfig
from llmswap.kvcache.keeper import KvKeeper, KvReport, KvShared, prepare_kv_dir
from llmswap.process import sleeping
from llmswap.process.child import Child, spawn_child
from llmswap.process.durations import format_go_duration
from llmswap.process.ending import terminate
from llmswap.process.errors import StartAborted, StartFailed, spawn_problem
from llmswap.process.events import LifeTimes, ProcessEvent, StopCause
from llmswap.process.health import (
    HealthEndpointMissing,
    health_url,
    missing_endpoint_message,
    wait_until_healthy,
)
from llmswap.process.idle import IdleTimer
from llmswap.process.logring import LogRing
from llmswap.process.ports import ensure_port_free
from llmswap.process.run import Outcome, Run, describe_exit
from llmswap.process.state import ProcessState

logger = logging.getLogger("llmswap.process")
upstream_logger = logging.getLogger("llmswap.upstream")

ABORT_GRACE = 5.0  # grace for a child whose start failed (llama-swap's value), capped by unloadTimeout
TAIL_LINES = 10  # output lines quoted when a child dies

class Process:
    """Owns one upstream server process. All methods run on the event-loop thread.

    The child runs in its own session (so stops reach everything it forks) with a Linux parent-death signal:
    if the proxy dies, even by SIGKILL, the kernel kills the child. That signal follows the thread that
    spawned the child, which is why every spawn happens on the event-loop thread (see `child.py`).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        on_event: Callable[[ProcessEvent], None] | None = None,
        log_ring: LogRing | None = None,
        mirror: LogRing | None = None,
        clock: Callable[[], float] = time.monotonic,
        kv: KvShared | None = None,
    ) -> None:
        self.config = config
        self.id = config.id
        self.logs = log_ring if log_ring is not None else LogRing(config.id)
        self.pid: int | None = None
        self.last_start_duration: float | None = None
        self._mirror = mirror
        self._on_event = on_event
        self._clock = clock
        self._state = ProcessState.STOPPED
        self._run: Run | None = None
        self._closing = False
        self._idle = IdleTimer(config.ttl)
        self._kv = KvKeeper(config, kv or KvShared()) if config.kv_cache is not None else None
        self.asleep_since: float | None = None  # when the server went to sleep (clock), while it sleeps

    def __repr__(self) -> str:
        return f"<Process {self.id} {self._state.value} pid={self.pid}>"

    @property
    def state(self) -> ProcessState:
        """An advisory snapshot: never decide to start or stop on it, call ensure_ready()/stop()."""
        return self._state

    @property
    def in_flight(self) -> int:
        return self._idle.in_flight

    async def ensure_ready(self) -> LifeTimes | None:
        """Return once the upstream is ready, starting it if needed; concurrent callers share one start.
        Answers what the start (or the wake) took, phase by phase; None when it was ready already.

        Raises StartFailed (spawn error, premature exit, health-check timeout, port taken) or StartAborted
        (a stop or the shutdown arrived during the start). Cancelling the caller does not cancel the start.
        """
        while True:
            if self._closing:
                raise StartAborted(f"{self.id}: process is shut down")
            run = self._run if self._run is not None else self._begin_run()
            child_gone = run.child is not None and run.child.exited.done()
            if (
                run.stop_requested
                or self._state is ProcessState.STOPPING
                or (self._state in (ProcessState.READY, ProcessState.SLEEPING) and child_gone)
            ):
                # This life is ending: let it finish, then start a fresh one.
                await asyncio.shield(run.done)
                continue
            if self._state is ProcessState.READY:
                return None
            if self._state is ProcessState.SLEEPING:
                if await asyncio.shield(run.ask("wake")):
                    return LifeTimes(wake=run.times.wake)
                continue  # the wake failed and the supervisor stops that life: start a fresh one
            await asyncio.shield(run.ready)
            return LifeTimes(start=run.times.start, restore=run.times.restore)

    async def sleep(self, timeout: float | None = None) -> bool:
        """Put the ready server to sleep (its `sleep:` call) instead of stopping it; True once it sleeps.
        A server that cannot sleep, or whose sleep fails, is stopped (`timeout` as for `stop`)."""
        run = self._run
        can = run is not None and self._state is ProcessState.READY and self.config.sleep_call is not None
        if can and run is not None and await asyncio.shield(run.ask("sleep")):
            return True
        await self.stop(timeout)
        return False

    async def stop(self, timeout: float | None = None) -> LifeTimes | None:
        """Stop the upstream (None: the model's unloadTimeout as grace); aborts a start; no-op if stopped.
        Answers what the stop took (its save, its signal to exit); None when nothing was running."""
        if (run := self._run) is None:
            return None
        run.request_stop(self.config.unload_timeout if timeout is None else timeout, StopCause.REQUESTED)
        await asyncio.shield(run.done)
        return LifeTimes(save=run.times.save, stop=run.times.stop)

    async def shutdown(self, timeout: float = 1.0) -> None:
        """Stop for good: the child is gone when this returns and the process never starts again."""
        self._closing = True
        if (run := self._run) is not None:
            run.request_stop(timeout, StopCause.SHUTDOWN)
            await asyncio.shield(run.done)
        self._state = ProcessState.SHUTDOWN

    def request_started(self) -> None:
        """A request is in flight: the TTL holds until its `request_ended` (exactly one per start)."""
        self._idle.request_started()

    def request_ended(self) -> None:
        """A request ended: the TTL counts again from this moment."""
        self._idle.request_finished(self._clock())
        if self._run is not None and self._idle.ttl > 0:
            self._run.wake.set()  # re-arm the TTL timer from now

    # -- the supervisor: everything below runs on the run's own task ------------------------------------

    def _begin_run(self) -> Run:
        loop = asyncio.get_running_loop()
        run = Run(loop, self.config.unload_timeout)
        self._run = run
        self._state = ProcessState.STARTING
        run.task = loop.create_task(self._supervise(run), name=f"llmswap-process-{self.id}")
        return run

    async def _supervise(self, run: Run) -> None:
        try:
            final = await self._live(run)
        except asyncio.CancelledError:
            # The event loop is being torn down around us: no time left for a graceful stop.
            self._abandon(run)
            self._end_run(run, ProcessEvent(
                self.id, "stopped", detail="supervisor cancelled", cause=StopCause.INTERNAL))
            raise
        except Exception as exc:
            logger.exception("[%s] process supervisor failed", self.id)
            self._abandon(run)
            run.fail(StartFailed(f"internal error while running {self.id}: {exc!r}"))
            detail = f"internal error: {exc!r}"
            final = ProcessEvent(self.id, "stopped", detail=detail, cause=StopCause.INTERNAL)
        self._end_run(run, final)

    async def _live(self, run: Run) -> ProcessEvent:
        config = self.config
        self._emit(ProcessEvent(self.id, "starting"))
        deadline = self._clock() + config.health_check_timeout
        try:
            argv = self._argv()
            await ensure_port_free(self.id, config.proxy)
            self._prepare_kv()
        except StartFailed as error:
            return self._start_failed(run, error)
        if run.stop_requested:
            self._state = ProcessState.STOPPING
            aborted = StopCause.START_ABORTED
            self._emit(ProcessEvent(self.id, "stopping", detail=aborted.value, cause=aborted))
            run.fail(StartAborted())
            return ProcessEvent(self.id, "stopped", detail=aborted.value, cause=aborted)

        run.output_mark = self.logs.total
        logger.info("[%s] starting: %s", self.id, self.config.argv_shown)
        try:
            child = await spawn_child(argv, env=self._env(), on_line=self._on_output)
        except (OSError, subprocess.SubprocessError) as exc:
            failure = StartFailed(f"failed to start command '{self.config.argv_shown}': "
                                  f"{spawn_problem(exc, argv[0], self._env().get('PATH', ''))}")
            return self._start_failed(run, failure)
        run.child = child
        self.pid = child.pid
        spawned = self._clock()

        outcome = await self._await_start(run, child, deadline)
        if outcome is Outcome.READY:
            run.times = replace(run.times, start=self._clock() - spawned)
        if outcome is Outcome.READY and self._kv is not None:
            restored = await self._kv.restore()  # before any request is granted to the server
            if restored is not None:
                run.times = replace(run.times, restore=restored.seconds)
            self._emit_kv(restored)
        if outcome is Outcome.READY:
            duration = self._clock() - spawned
            self.last_start_duration = duration
            self._state = ProcessState.READY
            self._idle.became_ready(self._clock())
            run.ready.set_result(None)
            logger.info("[%s] ready in %.3fs (pid %d)", self.id, duration, child.pid)
            self._emit(ProcessEvent(self.id, "ready", duration=duration))
            return await self._serve(run, child)
        if outcome is Outcome.ABORTED:
            return await self._stop(run, child)
        if outcome is Outcome.EXITED:
            exit_code = child.returncode
            await self._terminate(run, child)
            message = f"upstream command exited prematurely ({describe_exit(exit_code)})"
            return self._start_failed(run, StartFailed(message + self._last_output(run)), exit_code)
        self._state = ProcessState.STOPPING
        run.grace = min(run.grace, ABORT_GRACE)
        await self._terminate(run, child)
        url = health_url(config.proxy, config.check_endpoint) or ""
        message = missing_endpoint_message(url) if outcome is Outcome.NO_ENDPOINT else (
            f"health check timed out after {format_go_duration(config.health_check_timeout)}: {url} never "
            "answered 200")
        return self._start_failed(run, StartFailed(message + self._last_output(run)), child.returncode)

    async def _await_start(self, run: Run, child: Child, deadline: float) -> Outcome:
        url = health_url(self.config.proxy, self.config.check_endpoint)
        if url is None:
            return Outcome.ABORTED if run.stop_requested else Outcome.READY
        health = asyncio.create_task(wait_until_healthy(url, clock=self._clock), name=f"health-{self.id}")
        try:
            while True:
                # A dead child beats a passed probe: whatever answered 200, it was not this upstream.
                if run.stop_requested:
                    return Outcome.ABORTED
                if child.exited.done():
                    return Outcome.EXITED
                if health.done():
                    missing = isinstance(health.exception(), HealthEndpointMissing)
                    return Outcome.NO_ENDPOINT if missing else Outcome.READY
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return Outcome.TIMED_OUT
                await run.pause(remaining, child.exited, health)
        finally:
            if not health.done():
                health.cancel()
                await asyncio.wait({health})

    async def _serve(self, run: Run, child: Child) -> ProcessEvent:
        while True:
            if run.stop_requested:
                return await self._stop(run, child)
            if child.exited.done():
                return await self._exited(run, child)
            if run.asked is not None and not run.asked[1].done():
                await self._sleep_or_wake(run, *run.asked)
                continue
            now = self._clock()
            deadline = self._idle.deadline()
            if deadline is not None and now >= deadline:
                detail = f"idle for {format_go_duration(self.config.ttl)} (ttl)"
                logger.info("[%s] unloading: %s", self.id, detail)
                self._emit(ProcessEvent(self.id, "ttl_expired", detail=detail))
                run.request_stop(self.config.unload_timeout, StopCause.TTL)
                continue
            await run.pause(None if deadline is None else deadline - now, child.exited)

    async def _sleep_or_wake(self, run: Run, what: str, outcome: asyncio.Future[bool]) -> None:
        began = self._clock()
        failed = await sleeping.perform(self.config, what)
        took = self._clock() - began
        if failed:
            instead = "stopping it" if what == "sleep" else "restarting it cold"
            logger.warning("[%s] %s failed (%s); %s instead", self.id, what, failed, instead)
            if what == "wake":
                run.request_stop(self.config.unload_timeout, StopCause.REQUESTED)
        else:
            if what == "wake":
                run.times = replace(run.times, wake=took)
            self._state = ProcessState.SLEEPING if what == "sleep" else ProcessState.READY
            self.asleep_since = self._clock() if what == "sleep" else None
            self._idle.became_ready(self._clock())
            logger.info("[%s] %s in %.3fs (pid %s)", self.id, "asleep" if what == "sleep" else "awake", took,
                        self.pid)
            self._emit(ProcessEvent(self.id, "slept" if what == "sleep" else "woke", duration=took))
        if not outcome.done():
            outcome.set_result(not failed)

    async def _stop(self, run: Run, child: Child) -> ProcessEvent:
        aborting = not run.ready.done()
        cause = StopCause.START_ABORTED if aborting else run.stop_cause
        reason = cause.value
        self._state = ProcessState.STOPPING
        self._emit(ProcessEvent(self.id, "stopping", detail=reason, cause=cause))
        if self._kv is not None and not aborting and not child.exited.done():
            began = self._clock()
            self._emit_kv(await self._kv.save())
            run.times = replace(run.times, save=self._clock() - began)
        signalled = self._clock()
        await self._terminate(run, child)
        run.times = replace(run.times, stop=self._clock() - signalled)
        run.fail(StartAborted())
        logger.info("[%s] stopped (%s, %s)", self.id, reason, describe_exit(child.returncode))
        return ProcessEvent(self.id, "stopped", exit_code=child.returncode, detail=reason, cause=cause)

    async def _exited(self, run: Run, child: Child) -> ProcessEvent:
        exit_code = child.returncode
        await self._terminate(run, child)
        detail = f"upstream process exited unexpectedly ({describe_exit(exit_code)})" + self._last_output(run)
        logger.warning("[%s] %s", self.id, detail)
        return ProcessEvent(self.id, "exited", exit_code=exit_code, detail=detail)

    async def _terminate(self, run: Run, child: Child) -> None:
        await terminate(run, child, self.config, clock=self._clock, env=self._env(), on_line=self._on_output)

    def _start_failed(self, run: Run, error: StartFailed, exit_code: int | None = None) -> ProcessEvent:
        logger.warning("[%s] start failed: %s", self.id, error.message)
        run.fail(error)
        return ProcessEvent(self.id, "start_failed", exit_code=exit_code, detail=error.message)

    def _end_run(self, run: Run, final: ProcessEvent) -> None:
        if self._run is run:
            self._run = None
        self.pid = self.asleep_since = None
        self._state = ProcessState.SHUTDOWN if self._closing else ProcessState.STOPPED
        run.fail(StartAborted())
        self._emit(final)
        if not run.done.done():
            run.done.set_result(None)

    def _abandon(self, run: Run) -> None:
        if run.child is not None:
            run.child.signal_group(signal.SIGKILL)
            run.child.abandon_pipe()

    def _prepare_kv(self) -> None:
        try:
            prepare_kv_dir(self.config, self._kv)
        except OSError as exc:
            raise StartFailed(f"cannot prepare {self.config.kv_dir} for the slot saves: {exc}") from None

    def _argv(self) -> tuple[str, ...]:
        if not self.config.cmd:
            raise StartFailed(f"models.{self.id}.cmd is empty: set the command that starts the upstream")
        if not self.config.proxy:
            raise StartFailed(f"upstream proxy missing: set models.{self.id}.proxy to its base URL")
        return self.config.cmd

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.config.env)
        return env

    def _on_output(self, line: str) -> None:
        self.logs.append(line)
        if self._mirror is not None:
            self._mirror.append(line)
        upstream_logger.debug("[%s] %s", self.id, line)

    def _last_output(self, run: Run) -> str:
        return self.logs.quoted_tail(TAIL_LINES, since=run.output_mark)

    def _emit_kv(self, report: KvReport | None) -> None:
        if report is not None:
            self._emit(ProcessEvent(self.id, "kv", kv=report))

    def _emit(self, event: ProcessEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:
            logger.exception("[%s] on_event handler failed for %r", self.id, event.kind)


async def shutdown_all(processes: Iterable[Process], timeout: float = 1.0) -> None:
    """Shut every process down concurrently; returns when none of their children is left."""
    await asyncio.gather(*(process.shutdown(timeout) for process in processes))
