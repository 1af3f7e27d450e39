"""Who serves each new connection (`Turns`): the shares over many connections, main keeping a lone client's,
and the turns it so took paid back to the workers."""

from __future__ import annotations

from collections import Counter

import pytest

from llmswap.workers.turns import Turns

MAIN = None


def owners(turns: Turns, count: int, workers: int, main_holds: int) -> list[int | None]:
    return [turns.next(workers, main_holds) for _ in range(count)]


def test_without_workers_main_takes_every_connection() -> None:
    assert owners(Turns(2, 3, 4), 10, workers=0, main_holds=100) == [MAIN] * 10


def test_under_load_main_keeps_its_share_and_the_workers_take_theirs_in_turn() -> None:
    taken = owners(Turns(2, 3, 4), 40, workers=2, main_holds=100)
    assert Counter(taken) == {MAIN: 10, 0: 15, 1: 15}  # 2 : 3 : 3 of every 8
    assert taken[:8] == [MAIN, MAIN, 0, 1, 0, 1, 0, 1]


def test_main_keeps_every_connection_while_it_holds_few() -> None:
    turns = Turns(2, 3, 4)
    assert [turns.next(1, holds) for holds in range(4)] == [MAIN] * 4


def test_the_turns_main_kept_early_go_to_the_workers_once_it_holds_enough() -> None:
    turns = Turns(2, 3, 4)
    # A burst of 20 connections: the first 4 find main holding 0 to 3 and stay; two of those were the
    # worker's turns, which main owes.
    taken = [turns.next(1, min(opened, 4)) for opened in range(20)]
    assert taken[:4] == [MAIN] * 4
    assert Counter(taken) == {MAIN: 8, 0: 12}  # 2 : 3, as if main had taken none early
    assert taken[4:] == [0, 0, 0, 0, 0, 0, MAIN, MAIN, 0, 0, 0, MAIN, MAIN, 0, 0, 0]


def test_what_main_owes_is_bounded_by_what_it_can_hold_early() -> None:
    turns = Turns(2, 3, 4)
    owners(turns, 1000, workers=1, main_holds=0)  # a lone client connecting again and again: main's
    later = owners(turns, 20, workers=1, main_holds=10)
    assert later.count(MAIN) == 8 - 4  # of its 8 turns in 20, main pays back 4 (not the hundreds it took)


@pytest.mark.parametrize(("main_share", "worker_share", "main_first"), [(-1, 3, 4), (2, 0, 4), (2, 3, -1)])
def test_shares_that_cannot_work_are_refused(main_share: int, worker_share: int, main_first: int) -> None:
    with pytest.raises(ValueError, match="shares"):
        Turns(main_share, worker_share, main_first)
