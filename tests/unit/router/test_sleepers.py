"""Which models sleep and how many may: pure rules, no process."""

from __future__ import annotations

from dataclasses import dataclass

from llmswap.config.model import ModelConfig
from llmswap.process.state import ProcessState
from llmswap.router.sleepers import host_allows_sleep, sleepers_to_stop

GIB = 1024**3


def test_a_sleep_keeps_a_tenth_of_the_host_memory_available() -> None:
    big = ModelConfig(id="big", cmd=("x",), vram=20 * GIB)
    assert host_allows_sleep(big, available=40 * GIB, total=64 * GIB)  # 20 left of 64: more than 6.4
    assert not host_allows_sleep(big, available=26 * GIB, total=64 * GIB)  # 6 left: less than a tenth
    unknown = ModelConfig(id="unknown", cmd=("x",))
    assert host_allows_sleep(unknown, available=7 * GIB, total=64 * GIB)
    assert not host_allows_sleep(unknown, available=6 * GIB, total=64 * GIB)


@dataclass
class Sleeper:
    state: ProcessState
    asleep_since: float | None = None


def test_beyond_max_sleeping_the_longest_asleep_go_first_never_the_one_to_wake() -> None:
    processes = {"a": Sleeper(ProcessState.SLEEPING, 1.0), "b": Sleeper(ProcessState.SLEEPING, 2.0),
                 "c": Sleeper(ProcessState.SLEEPING, 3.0), "d": Sleeper(ProcessState.READY)}
    assert sleepers_to_stop(processes, 2, keep="d") == ["a"]  # type: ignore[arg-type]
    assert sleepers_to_stop(processes, 1, keep="d") == ["a", "b"]  # type: ignore[arg-type]
    assert sleepers_to_stop(processes, 1, keep="a") == ["b"]  # a wakes: b and c would be two asleep
    assert sleepers_to_stop(processes, 3, keep="d") == []  # type: ignore[arg-type]
