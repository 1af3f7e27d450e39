"""Who serves each new connection when there are workers: main, or which worker (`Turns.next`).

Over many connections main keeps `main_share` of every `main_share + worker_share * workers`, and each
worker takes `worker_share`: a worker's request still costs main its grant, its record and its access line,
so main serves fewer connections than a worker does, and both end up near a full core under load.

A lone client is the exception: while main holds fewer than `main_first` connections it keeps every new
one, since a request a worker serves waits on messages between the processes (its grant, its end) and one
core is plenty for it. The turns main so takes from the workers are owed back (at most `main_first` of
them): once main holds enough, its next turns go to the workers until it is even, so a burst of
connections is split as if main had taken none early.
"""

from __future__ import annotations


class Turns:
    """The turn of each new connection. Pure: the caller says how many workers take connections and how many
    connections main holds now."""

    def __init__(self, main_share: int, worker_share: int, main_first: int) -> None:
        if main_share < 0 or worker_share < 1 or main_first < 0:
            raise ValueError("shares: main's at least 0, a worker's at least 1, main_first at least 0")
        self.main_share = main_share
        self.worker_share = worker_share
        self.main_first = main_first
        self._turn = -1  # position in the cycle of the last connection
        self._worker = -1  # the worker that took the last connection a worker took
        self._owed = 0  # workers' turns main took while it held few connections

    def next(self, workers: int, main_holds: int) -> int | None:
        """The worker (0 to `workers` - 1) that takes the connection, or None for main."""
        if workers <= 0:
            return None
        self._turn = turn = (self._turn + 1) % (self.main_share + self.worker_share * workers)
        mains = turn < self.main_share
        if main_holds < self.main_first:
            if not mains:
                self._owed = min(self._owed + 1, self.main_first)
            return None
        if mains:
            if not self._owed:
                return None
            self._owed -= 1
        self._worker = (self._worker + 1) % workers
        return self._worker
