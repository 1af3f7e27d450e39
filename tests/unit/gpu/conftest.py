"""Real child processes for the readers' process-tree tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

# Blocks until its stdin closes, so the test decides when it ends.
_WAIT_FOR_STDIN = "import sys; sys.stdin.read()"


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `python -c code` children that are always killed and reaped after the test."""
    children: list[subprocess.Popen[bytes]] = []

    def start(code: str = _WAIT_FOR_STDIN) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
