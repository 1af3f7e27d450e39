"""The keeper: a small process per upstream that ends the upstream's whole process group once llmswap is gone,
however llmswap died (kill -9 included).

The parent-death signal (`child.py`) reaches only the direct child; what it forked (`sh -c 'server & wait'`,
a container runtime's shim) would be orphaned. So next to each upstream llmswap starts this file as a script
(`python -I -S keeper.py PGID GRACE`: standard library only, nothing of llmswap imported, so it starts in a
few milliseconds and stays small). It runs in a session of its own, outside the group it guards, and holds
the read end of a pipe whose only write end is llmswap's:

- EOF on the pipe (llmswap died: the kernel closed its descriptors) -> SIGTERM to the group, GRACE
  seconds, SIGKILL to what is left; then it exits.
- a byte on the pipe (llmswap stopped the upstream itself, the normal path) -> it exits and does nothing:
  stops, their timeouts, exit codes and logs stay llmswap's own.
- the group empty -> it exits: nothing left to guard, and a group id that no longer exists could later
  name somebody else's group.

The upstream itself is spawned exactly as before (same pid, same group, same pipe), so its exit status and
output reach llmswap unchanged; the keeper only adds a process beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time

logger = logging.getLogger("llmswap.process")

GRACE = 5.0  # seconds between SIGTERM and SIGKILL once llmswap is gone (llama-swap's stop grace)
POLL = 1.0  # seconds between checks that the guarded group still exists
STAND_DOWN = b"."


class Keeper:
    """llmswap's end of one keeper: the pipe's write end, and the process to reap once it stood down."""

    def __init__(self, popen: subprocess.Popen[bytes], pipe: int) -> None:
        self._popen = popen
        self._pipe: int | None = pipe

    @property
    def pid(self) -> int:
        return self._popen.pid

    def stand_down(self) -> None:
        """The upstream was stopped the normal way: let the keeper exit without touching its group."""
        if self._pipe is None:
            return
        with contextlib.suppress(OSError):  # the keeper already left (its group was empty)
            os.write(self._pipe, STAND_DOWN)
        os.close(self._pipe)
        self._pipe = None
        # Reap it off the loop: it exits at once, and a zombie per stopped upstream would pile up.
        threading.Thread(target=self._popen.wait, name=f"keeper-{self.pid}", daemon=True).start()


def start_keeper(pgid: int, grace: float = GRACE) -> Keeper | None:
    """Start a keeper for process group `pgid`; None (logged) where it cannot run: the upstream then has
    only the parent-death signal."""
    if sys.platform == "win32":
        return None
    read_end, write_end = os.pipe()  # both close-on-exec: no other child inherits llmswap's end
    try:
        popen = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(pgid), repr(grace)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # no terminal's Ctrl-C or hang-up reaches it; it leaves on its own terms
        )
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(write_end)
        logger.warning("no keeper for process group %d (%s): its grandchildren may outlive a killed llmswap",
                       pgid, exc)
        return None
    finally:
        os.close(read_end)
    return Keeper(popen, write_end)


# ------------------------------------------------------------------------------------ the keeper process


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _end_group(pgid: int, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _group_exists(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def keep(pgid: int, grace: float, pipe: int = 0) -> None:
    """Guard group `pgid` until llmswap stands the keeper down, llmswap is gone, or the group is."""
    while _group_exists(pgid):
        readable, _, _ = select.select([pipe], [], [], POLL)
        if not readable:
            continue
        try:
            data = os.read(pipe, 64)
        except OSError:
            data = b""
        if not data:
            _end_group(pgid, grace)
        return


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    keep(int(sys.argv[1]), float(sys.argv[2]))
