"""The demo's own output lines. Each is flushed at once: process logs and benchmarks read them live."""

import sys

PREFIX = "llmswap-demo: "


def say(line: str) -> None:
    sys.stdout.write(f"{PREFIX}{line}\n")
    sys.stdout.flush()


def complain(line: str) -> None:
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()
