"""When a model that can sleep (`sleep:`/`wake:`) is put to sleep instead of stopped, and how many may sleep.

A level-1 sleep (vLLM) moves the weights from the GPU to host memory, so a sleep is only worth it while the
host can take them and stay comfortable: the rule is that, after taking the model's weights, at least a
tenth of the host's memory is still available (`psutil`'s "available": free memory plus what the kernel can
reclaim). The weights' size is the model's declared `vram` when it has one (an upper bound: the KV cache
is discarded, not moved); without one only the tenth is kept. Beyond `maxSleeping` models asleep, the one
asleep longest is stopped; never the one about to be woken.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmswap.config.model import ModelConfig
from llmswap.process.state import ProcessState
from llmswap.router.types import ProcessLike

RESERVE_FRACTION = 0.10  # of the host's memory kept available after a sleep


def host_allows_sleep(model: ModelConfig, available: int, total: int) -> bool:
    """Whether the host keeps `RESERVE_FRACTION` of its memory available once `model` sleeps."""
    return available - (model.vram or 0) >= total * RESERVE_FRACTION


def sleepers_to_stop(processes: Mapping[str, ProcessLike], max_sleeping: int, keep: str) -> list[str]:
    """The sleeping models beyond `max_sleeping`, asleep longest first. `keep` is about to wake: it is neither
    stopped nor counted."""
    asleep = sorted((p.asleep_since or 0.0, m) for m, p in processes.items()
                    if p.state is ProcessState.SLEEPING and m != keep)
    return [m for _, m in asleep[:max(0, len(asleep) - max_sleeping)]]
