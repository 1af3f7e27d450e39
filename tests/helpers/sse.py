"""Read server-sent events in tests: split a stream body into (event, data) pairs, JSON-decoding the data."""

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    name: str | None  # the `event:` line, None when absent (OpenAI streams)
    data: str

    def json(self) -> dict[str, Any]:
        value = json.loads(self.data)
        assert isinstance(value, dict), f"event data is not a JSON object: {self.data!r}"
        return value


def parse_events(body: str) -> list[Event]:
    """Every event in ``body``; multi-line data is joined with newlines, comments are skipped."""
    events: list[Event] = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].removeprefix(" "))
        if data:
            events.append(Event(name, "\n".join(data)))
    return events
