"""The group router's eviction policy: llama-swap's groups with `swap`, `exclusive` and `persistent`.

- `swap: true`: one member of the group runs at a time; `false`: members run side by side.
- `exclusive: true`: loading a member stops the members of every other group that is not
  persistent; `false`: other groups are left alone.
- `persistent: true`: other groups never stop its members (it has no effect inside the group).

Two of llama-swap's rules are kept on purpose although they surprise: a non-exclusive group never
stops the members of a running exclusive group, and asking for an exclusive group's member that is
already ready still evicts whatever a non-exclusive group loaded meanwhile (a swap, not the fast
path). The implicit `(default)` group, built by the config loader, holds every model in no group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmswap.config.model import DEFAULT_GROUP_ID, GroupConfig

# A model that no group lists (only possible when a caller builds the mapping by hand) behaves as
# the implicit default group does: alone, and exclusive.
_ALONE = GroupConfig(id=DEFAULT_GROUP_ID, swap=True, exclusive=True, persistent=False)


class GroupSwapper:
    """A pure function of the group configuration; logs nothing."""

    def __init__(self, groups: Mapping[str, GroupConfig]) -> None:
        self._groups = dict(groups)
        self._group_of: dict[str, str] = {}
        for group_id, group in self._groups.items():
            for member in group.members:
                other = self._group_of.get(member)
                if other is not None and other != group_id:
                    raise ValueError(
                        f"model member {member} is used in multiple groups: {other} and {group_id}"
                    )
                self._group_of[member] = group_id

    def group_of(self, model: str) -> str:
        return self._group_of.get(model, DEFAULT_GROUP_ID)

    def _group(self, group_id: str) -> GroupConfig:
        return self._groups.get(group_id, _ALONE)

    def evictions_for(self, target: str, running: Sequence[str]) -> list[str]:
        target_group_id = self.group_of(target)
        target_group = self._group(target_group_id)
        evict: list[str] = []
        for model in running:
            if model == target:
                continue
            group_id = self.group_of(model)
            if group_id == target_group_id:
                if target_group.swap:
                    evict.append(model)
            elif target_group.exclusive and not self._group(group_id).persistent:
                evict.append(model)
        return evict

    def on_swap_start(self, target: str, running: Sequence[str]) -> None:
        """Nothing to log: the scheduler's swap line already says what stops."""
