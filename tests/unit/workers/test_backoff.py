"""The wait before a worker is started again: doubling while its runs stay short, reset by one that lasted."""

from llmswap.workers.supervisor import Backoff, describe


def test_short_runs_double_the_wait_up_to_the_most() -> None:
    backoff = Backoff(0.5, 10.0, stable_after=30.0)
    assert [backoff.after(1.0) for _ in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_a_run_that_lasted_starts_the_backoff_over() -> None:
    backoff = Backoff(0.5, 10.0, stable_after=30.0)
    for _ in range(4):
        backoff.after(0.0)

    assert backoff.after(30.0) == 0.5
    assert backoff.after(29.9) == 1.0  # the next short run doubles again from there


def test_exit_statuses_are_described_by_signal_name() -> None:
    assert describe(-9) == "killed by SIGKILL"
    assert describe(3) == "exit status 3"
