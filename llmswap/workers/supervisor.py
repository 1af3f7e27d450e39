"""Main's worker processes: started sharing main's listening socket, started again when one dies, stopped
with the stop's grace.

Each worker runs `WorkerSpec.argv` with the listening socket inherited under the same descriptor number,
named to it by `LLMSWAP_LISTEN_FD` (and its slot by `LLMSWAP_WORKER_INDEX`). Workers accepting from one
socket share the connections by load (whoever is free accepts), unlike SO_REUSEPORT's hash of addresses.

Main owns its workers' lifetimes, so any exit it did not ask for is unexpected, even with status 0: the
worker is started again after a backoff (`backoff` seconds, doubling up to `max_backoff`, back to `backoff`
once a run lasted `stable_after` seconds), so a worker that cannot start does not spin. `stop(grace)` sends
SIGTERM to every worker, SIGKILL to those still running `grace` seconds later, and returns once all are
reaped.

Each worker runs in a session of its own with a parent-death signal (`llmswap.process.child`): a Ctrl-C or
hang-up on main's terminal reaches main alone, which then stops its workers with the grace, and a main
killed outright takes its workers with it. Their stdout and stderr are main's own, inherited: a worker's
log lines land where main's do, interleaved by line, with no pipe for main to drain and nothing lost when
main is busy.

What happens is reported as typed events to an observer (`WorkerStarted`, `WorkerExited`,
`WorkerFailedToStart`) and logged under "llmswap.workers"; nothing depends on the log's wording.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from llmswap.process.child import parent_death_signal

log = logging.getLogger("llmswap.workers")

LISTEN_FD_ENV = "LLMSWAP_LISTEN_FD"  # the descriptor number of the inherited listening socket
WORKER_INDEX_ENV = "LLMSWAP_WORKER_INDEX"  # the worker's slot, 0 to n-1; a restarted worker keeps it


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker runs: its command line, the variables added to main's environment, and the
    listening socket it inherits (None: none)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    listener: socket.socket | None = None

    def environment(self, index: int) -> dict[str, str]:
        env = {**os.environ, **self.env, WORKER_INDEX_ENV: str(index)}
        if self.listener is not None:
            env[LISTEN_FD_ENV] = str(self.listener.fileno())
        return env

    def pass_fds(self) -> tuple[int, ...]:
        return () if self.listener is None else (self.listener.fileno(),)


class WorkerStarted(NamedTuple):
    index: int
    pid: int


class WorkerExited(NamedTuple):
    index: int
    pid: int
    returncode: int  # negative: killed by that signal
    restarting: bool  # False once a stop began
    delay: float = 0.0  # seconds until it is started again, when restarting


class WorkerFailedToStart(NamedTuple):
    index: int
    error: str
    restarting: bool
    delay: float = 0.0  # seconds until the next attempt, when restarting


WorkerEvent = WorkerStarted | WorkerExited | WorkerFailedToStart
Observer = Callable[[WorkerEvent], None]


class Backoff:
    """The wait before starting a worker again: `first` seconds, doubling up to `most` while runs stay short,
    `first` again after a run of at least `stable_after` seconds."""

    def __init__(self, first: float, most: float, stable_after: float) -> None:
        self.first = first
        self.most = most
        self.stable_after = stable_after
        self._next = first

    def after(self, uptime: float) -> float:
        """The wait after a run of `uptime` seconds (0 for a start that failed)."""
        if uptime >= self.stable_after:
            self._next = self.first
        delay = self._next
        self._next = min(delay * 2, self.most)
        return delay


@dataclass
class _Slot:
    index: int
    backoff: Backoff
    process: asyncio.subprocess.Process | None = None
    first_attempt: asyncio.Event = field(default_factory=asyncio.Event)  # set after the first spawn attempt
    task: asyncio.Task[None] | None = None


def describe(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


class Supervisor:
    """Starts, watches and stops the worker processes of one spec; see the module's docstring."""

    def __init__(
        self,
        spec: WorkerSpec,
        observer: Observer | None = None,
        *,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        stable_after: float = 30.0,
    ) -> None:
        self.spec = spec
        self._observer = observer
        self._backoff = (backoff, max_backoff, stable_after)
        self._slots: list[_Slot] = []
        self._stopping = asyncio.Event()
        self._stop_signal: int | None = None  # what a stop sends now: SIGTERM, then SIGKILL after the grace
        self._stopped: asyncio.Task[None] | None = None

    @property
    def pids(self) -> list[int | None]:
        """The process id in each slot; None while that worker waits to be started again."""
        return [slot.process.pid if slot.process is not None else None for slot in self._slots]

    async def start(self, n: int) -> None:
        """Start `n` workers (slots 0 to n-1); return once each was spawned, or failed to be (then it is
        retried with the backoff). Once only."""
        if self._slots or self._stopping.is_set():
            raise RuntimeError("a supervisor starts its workers once")
        loop = asyncio.get_running_loop()
        for index in range(n):
            slot = _Slot(index, Backoff(*self._backoff))
            slot.task = loop.create_task(self._keep(slot), name=f"llmswap-worker-{index}")
            self._slots.append(slot)
        for slot in self._slots:
            await slot.first_attempt.wait()

    def stop_restarting(self) -> None:
        """From now on a worker that exits stays down (they are about to leave: a stop follows)."""
        self._stopping.set()

    async def stop(self, grace: float, *, leaving: float = 0.0) -> None:
        """SIGTERM to every worker, SIGKILL to those still running after `grace` seconds; return once every
        worker is reaped. `leaving`: seconds the workers get first to exit by themselves (asked another
        way, over their channel), none started again meanwhile; the signals go to those still running
        after it. Calling it again waits for the same stop; cancelling a caller does not cancel the stop."""
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_task(self._stop(grace, leaving))
        await asyncio.shield(self._stopped)

    async def _stop(self, grace: float, leaving: float) -> None:
        self._stopping.set()
        tasks = [slot.task for slot in self._slots if slot.task is not None]
        if tasks and leaving > 0:
            _, still = await asyncio.wait(tasks, timeout=leaving)
            if still:
                log.warning("%d worker(s) still running %gs after they were asked to leave: SIGTERM",
                            len(still), leaving)
        self._stop_signal = signal.SIGTERM
        for slot in self._slots:
            self._signal(slot, signal.SIGTERM)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(grace, 0.0))
        if pending:
            self._stop_signal = signal.SIGKILL
            for slot in self._slots:
                if slot.task in pending and slot.process is not None:
                    log.warning("worker %d (pid %d) still running %gs after SIGTERM: SIGKILL",
                                slot.index, slot.process.pid, grace)
                    self._signal(slot, signal.SIGKILL)
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, BaseException):
                log.error("a worker's keeper failed", exc_info=outcome)

    # ---------------------------------------------------------------------------- one slot

    async def _keep(self, slot: _Slot) -> None:
        """Run the slot's worker until the stop, starting it again after each unexpected exit."""
        try:
            await self._run(slot)
        finally:
            slot.first_attempt.set()  # `start` waits for nobody that is gone

    async def _run(self, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            try:
                process = await self._spawn(slot.index)
            except (OSError, subprocess.SubprocessError) as exc:
                slot.first_attempt.set()
                restarting = not self._stopping.is_set()
                delay = slot.backoff.after(0.0) if restarting else 0.0
                log.error("worker %d could not be started: %s%s", slot.index, exc,
                          f"; trying again in {delay:g}s" if restarting else "")
                self._report(WorkerFailedToStart(slot.index, str(exc), restarting, delay))
                if not restarting or await self._stopped_within(delay):
                    return
                continue
            slot.process = process
            began = loop.time()
            slot.first_attempt.set()
            log.info("worker %d started (pid %d)", slot.index, process.pid)
            self._report(WorkerStarted(slot.index, process.pid))
            if self._stop_signal is not None:  # the stop began while it was being spawned
                self._signal(slot, self._stop_signal)
            returncode = await process.wait()
            slot.process = None
            if self._stopping.is_set():
                log.info("worker %d (pid %d) stopped (%s)", slot.index, process.pid, describe(returncode))
                self._report(WorkerExited(slot.index, process.pid, returncode, False))
                return
            delay = slot.backoff.after(loop.time() - began)
            log.warning("worker %d (pid %d) exited unexpectedly (%s); starting it again in %gs",
                        slot.index, process.pid, describe(returncode), delay)
            self._report(WorkerExited(slot.index, process.pid, returncode, True, delay))
            if await self._stopped_within(delay):
                return

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        # Spawned from the loop's thread (asyncio forks there): the parent-death signal follows the thread
        # that forked, and this one lives as long as main.
        spec = self.spec
        return await asyncio.create_subprocess_exec(
            *spec.argv,
            stdin=subprocess.DEVNULL,
            env=spec.environment(index),
            pass_fds=spec.pass_fds(),
            start_new_session=True,
            preexec_fn=parent_death_signal(),
        )

    async def _stopped_within(self, delay: float) -> bool:
        """Wait `delay` seconds, or less if a stop begins; whether it did."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay)
        return self._stopping.is_set()

    def _signal(self, slot: _Slot, sig: int) -> None:
        # os.kill rather than Process.send_signal: that one polls the child first, and a poll that reaps it
        # steals the exit status from asyncio's watcher (which then reports 255). Unreaped, the pid is still
        # this worker's.
        process = slot.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it exited; not reaped yet
                os.kill(process.pid, sig)

    def _report(self, event: WorkerEvent) -> None:
        if self._observer is None:
            return
        try:
            self._observer(event)
        except Exception:
            log.exception("the workers' observer failed on %r", event)
