"""When an idle model is due for its TTL unload."""

from llmswap.process.idle import IdleTimer


def test_no_ttl_never_expires() -> None:
    timer = IdleTimer(ttl=0)
    timer.became_ready(100.0)
    assert timer.deadline() is None
    assert not timer.expired(10_000.0)


def test_counts_from_the_ready_moment_when_never_used() -> None:
    timer = IdleTimer(ttl=5)
    timer.became_ready(100.0)
    assert timer.deadline() == 105.0
    assert not timer.expired(104.9)
    assert timer.expired(105.0)


def test_counts_from_the_end_of_the_last_request() -> None:
    timer = IdleTimer(ttl=5)
    timer.became_ready(100.0)
    timer.request_started()
    timer.request_finished(103.0)
    assert timer.deadline() == 108.0


def test_held_while_any_request_is_in_flight() -> None:
    timer = IdleTimer(ttl=5)
    timer.became_ready(100.0)
    timer.request_started()
    timer.request_started()
    assert timer.deadline() is None
    timer.request_finished(110.0)
    assert timer.deadline() is None  # one still in flight
    assert not timer.expired(1_000.0)
    timer.request_finished(120.0)
    assert timer.deadline() == 125.0


def test_a_restart_counts_from_the_new_ready_moment() -> None:
    timer = IdleTimer(ttl=5)
    timer.became_ready(100.0)
    timer.request_started()
    timer.request_finished(101.0)
    timer.became_ready(200.0)
    assert timer.deadline() == 205.0


def test_more_ends_than_starts_do_not_go_negative() -> None:
    timer = IdleTimer(ttl=5)
    timer.request_finished(1.0)
    assert timer.in_flight == 0
    assert timer.deadline() == 6.0
