"""ArrivalRates: whether a model's clients wait for it (closed loop) or arrive regardless (open loop)."""

from __future__ import annotations

from llmswap.scheduler.arrivals import DEFAULT_CLOSEDNESS, HOLD_THRESHOLD, ArrivalRates


def cycle(rates: ArrivalRates, model: str, start: float, *, present_arrivals: int, absent_arrivals: int,
          present: float = 10.0, absent: float = 10.0) -> float:
    """One residency of `present` seconds, then one absence of `absent` seconds, arrivals spread out."""
    rates.loaded(model, start)
    for i in range(present_arrivals):
        rates.arrived(model, start + (i + 0.5) * present / present_arrivals, ready=True)
    rates.left(model, start + present)
    for i in range(absent_arrivals):
        rates.arrived(model, start + present + (i + 0.5) * absent / absent_arrivals, ready=False)
    return start + present + absent


def test_closedness_is_the_default_until_two_residencies_and_absences_were_seen():
    rates = ArrivalRates()
    assert rates.closedness("a", 0.0) == DEFAULT_CLOSEDNESS
    t = cycle(rates, "a", 0.0, present_arrivals=10, absent_arrivals=0)
    assert rates.closedness("a", t) == DEFAULT_CLOSEDNESS
    t = cycle(rates, "a", t, present_arrivals=10, absent_arrivals=0)
    rates.loaded("a", t)
    assert rates.closedness("a", t) == 1.0


def test_a_closed_loop_sends_nothing_while_its_model_is_away():
    rates = ArrivalRates()
    t = 0.0
    for _ in range(4):
        t = cycle(rates, "a", t, present_arrivals=9, absent_arrivals=0)
    assert rates.closedness("a", t) == 1.0
    assert rates.hold_factor("a", t) == 1.0


def test_open_loop_traffic_arrives_as_fast_while_its_model_is_away():
    rates = ArrivalRates()
    t = 0.0
    for _ in range(4):
        t = cycle(rates, "a", t, present_arrivals=3, absent_arrivals=3)
    assert rates.closedness("a", t) == 0.0
    assert rates.hold_factor("a", t) == 0.0


def test_mostly_open_loop_traffic_is_not_held_at_all():
    rates = ArrivalRates()
    t = 0.0
    for _ in range(4):
        t = cycle(rates, "a", t, present_arrivals=10, absent_arrivals=7)
    assert 0.0 < rates.closedness("a", t) < HOLD_THRESHOLD
    assert rates.hold_factor("a", t) == 0.0


def test_a_return_just_after_the_model_left_counts_as_arriving_while_loaded():
    rates = ArrivalRates()
    t = 0.0
    for _ in range(3):
        rates.loaded("a", t)
        rates.left("a", t + 1.0, window=0.4)  # served one request, then evicted at once (FIFO's way)
        rates.arrived("a", t + 1.05, ready=False)  # its client came back 50 ms later: a hold would catch it
        t += 10.0
    rates.loaded("a", t)
    assert rates.closedness("a", t) == 1.0


def test_an_arrival_after_the_window_counts_as_absent():
    rates = ArrivalRates()
    t = 0.0
    for _ in range(4):
        rates.loaded("a", t)
        rates.arrived("a", t + 0.5, ready=True)
        rates.left("a", t + 1.0, window=0.4)
        for k in range(6):  # as often as while it was loaded
            rates.arrived("a", t + 2.0 + k * 1.3, ready=False)
        t += 10.0
    rates.loaded("a", t)
    assert rates.hold_factor("a", t) == 0.0


def test_a_model_that_gets_nothing_while_loaded_is_not_worth_holding():
    rates = ArrivalRates()
    t = 0.0
    for _ in range(3):
        t = cycle(rates, "a", t, present_arrivals=0, absent_arrivals=1, present=1.0, absent=60.0)
    assert rates.closedness("a", t) == 0.0
