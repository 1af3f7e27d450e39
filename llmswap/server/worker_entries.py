"""The requests worker processes serve, in the main process's in-flight list (`GET /api/inflight`, the
events stream's `inflight`), beside its own: `TrackedEntries` is the `llmswap.workers.grants.Entries` the
grant service opens and closes them through. Such an entry's `task` is the request's `RemoteHolder`, so
`POST /api/inflight/{id}/cancel` reaches the worker serving it."""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from llmswap.server.inflight import InflightEntry, InflightTracker
from llmswap.workers.grants import RemoteHolder, Shown


class LazyHeaders(Mapping[str, str]):
    """A worker request's headers, made a case-insensitive mapping only if the entry is ever shown (most
    requests end before anyone looks)."""

    __slots__ = ("_made", "_pairs")

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self._pairs = pairs
        self._made: CIMultiDictProxy[str] | None = None

    def _mapping(self) -> CIMultiDictProxy[str]:
        if self._made is None:
            self._made = CIMultiDictProxy(CIMultiDict(self._pairs))
        return self._made

    def __getitem__(self, name: str) -> str:
        return self._mapping()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._pairs)

    def items(self) -> ItemsView[str, str]:
        return self._mapping().items()


class RemoteRequest(dict[object, object]):
    """What the in-flight list reads of a request, for one a worker serves."""

    __slots__ = ("headers", "method", "path", "remote")

    def __init__(self, shown: Shown) -> None:
        super().__init__()
        self.method = shown.method
        self.path = shown.path
        self.headers = LazyHeaders(shown.headers)
        self.remote = shown.peer

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


class TrackedEntries:
    """`Entries` over the server's tracker."""

    def __init__(self, tracker: InflightTracker) -> None:
        self.tracker = tracker

    def open(self, shown: Shown, model: str, holder: RemoteHolder) -> InflightEntry:
        entry = self.tracker.open(RemoteRequest(shown), model, None, holder)  # type: ignore[arg-type]
        holder.shown_id = entry.id  # what the worker's clean end names
        return entry

    def close(self, entry: object) -> None:
        if isinstance(entry, InflightEntry):
            self.tracker.close(entry)
