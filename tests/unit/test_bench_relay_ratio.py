"""bench/relay.py's ratio: the median of the rounds' own ratios, so a round the machine slowed down for both
sides counts like any other (the ratio of the two sides' medians would mix rounds)."""

from __future__ import annotations

from bench.relay import StreamTiming, per_round_ratio


def timing(tokens_per_second: float) -> StreamTiming:
    return StreamTiming(began=0.0, first_token=0.001, last_token=1000 / tokens_per_second, tokens=1000,
                        size=1)


def test_the_ratio_is_the_median_of_each_rounds_own() -> None:
    direct = [timing(90_000), timing(60_000), timing(100_000)]
    ours = [timing(81_000), timing(57_000), timing(70_000)]  # rounds: 0.90, 0.95, 0.70
    assert round(per_round_ratio({"direct": direct, "llmswap": ours}), 6) == 0.9
    # The two sides' medians would say 70,000 / 90,000 = 0.78: the second side's median is another round.
