"""The fan-out under `GET /api/events`: one `EventBus` per app, one bounded `Subscription` per stream.

An `Event` is one frame in llama-swap's envelope: `event:message`, then one `data:` line holding
`{"type": <type>, "data": <payload>}` where the payload is JSON *encoded as a string* (clients parse twice),
exactly as llama-swap writes it, so tools written against llama-swap read llmswap's stream unchanged.

Publishing is synchronous and never waits for a reader. Each subscriber has a bounded backlog: one that
falls behind has its backlog dropped (memory stays bounded) and is told so once (`Mark.RESYNC`), and the
stream then re-sends the current state in place of everything it missed.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_PENDING = 1024  # frames a subscriber may fall behind (llama-swap's per-connection buffer)
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: every parser skips it


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True)
class Event:
    """One envelope: `type` names the payload, `data` is the payload (a JSON-ready value)."""

    type: str
    data: Mapping[str, Any] | Sequence[Any]

    def encode(self) -> bytes:
        envelope = _json({"type": self.type, "data": _json(self.data)})
        # "replace": text that came from undecodable request bytes (a header aiohttp decoded with
        # surrogateescape, echoed in a log line) must not end the stream.
        return f"event:message\ndata:{envelope}\n\n".encode("utf-8", "replace")


class Mark(enum.Enum):
    """What a subscription yields besides events."""

    RESYNC = "resync"  # frames were dropped: send the current state again
    CLOSED = "closed"  # the stream must end (server shutdown, config reload, or closed by its reader)


class Subscription:
    """One subscriber's bounded backlog. Delivery is synchronous and never waits for the reader."""

    def __init__(self, bus: EventBus, max_pending: int) -> None:
        self._bus = bus
        self._pending: deque[Event] = deque()
        self._max_pending = max(1, max_pending)
        self._behind = False  # backlog dropped; nothing more is queued until the reader takes the resync
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        self.dropped = 0  # frames this subscriber never got (the resync stood in for them)

    def _deliver(self, event: Event) -> None:
        if self._closed:
            return
        if self._behind:
            self.dropped += 1
            return
        if len(self._pending) >= self._max_pending:
            self.dropped += len(self._pending) + 1
            self._pending.clear()
            self._behind = True
        else:
            self._pending.append(event)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take(self) -> Event | Mark | None:
        """The next event or mark, or None when there is nothing yet."""
        if self._behind:
            self._behind = False
            return Mark.RESYNC
        if self._pending:
            return self._pending.popleft()
        if self._closed:
            return Mark.CLOSED
        return None

    async def next(self, timeout: float | None = None) -> Event | Mark | None:
        """The next event or mark, waiting up to `timeout` seconds for one (None when none came)."""
        item = self.take()
        if item is not None:
            return item
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            self._waiter = None
            waiter.cancel()
        return self.take()

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def behind(self) -> bool:
        """Whether this subscriber fell behind and has not yet taken its resync."""
        return self._behind

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending.clear()
            self._behind = False
            self._bus._unsubscribe(self)
            self._wake()


class EventBus:
    """Fans events out to every subscriber; publishing is synchronous (call it on the loop thread).

    `on_listening(True)` is called when the first subscriber joins, `on_listening(False)` when the last
    one leaves: a source can then do no work at all for events nobody would get."""

    def __init__(self, max_pending: int = MAX_PENDING,
                 on_listening: Callable[[bool], None] | None = None) -> None:
        self.max_pending = max_pending
        self._subscribers: dict[Subscription, None] = {}  # in subscription order
        self._closed = False
        self._on_listening = on_listening
        # How many subscriptions are open: a plain attribute, read by sources on every request.
        self.subscribers = 0

    def subscribe(self) -> Subscription:
        subscription = Subscription(self, self.max_pending)
        if self._closed:
            subscription.close()
        else:
            self._subscribers[subscription] = None
            self.subscribers = len(self._subscribers)
            if self.subscribers == 1 and self._on_listening is not None:
                self._on_listening(True)
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        if self._subscribers.pop(subscription, False) is None:
            self.subscribers = len(self._subscribers)
            if self.subscribers == 0 and self._on_listening is not None:
                self._on_listening(False)

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """The open subscriptions, oldest first."""
        return tuple(self._subscribers)

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(self, event: Event) -> None:
        for subscription in tuple(self._subscribers):
            subscription._deliver(event)

    def end_streams(self) -> None:
        """End every open subscription (a config reload: clients reconnect to the new state); the bus
        stays open for new ones."""
        for subscription in tuple(self._subscribers):
            subscription.close()

    def close(self) -> None:
        """End every subscription (server shutdown); later subscriptions start closed."""
        self._closed = True
        self.end_streams()
