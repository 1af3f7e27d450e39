"""bench/wrk_nginx.py's rows from several rounds: each side's median, the median of the rounds' own ratios
(robust to a round the machine slowed down), errors over every round, and llmswap at 256 connections against
its own 64; and llmswap against a bare aiohttp proxy, throughput and CPU time per request."""

from __future__ import annotations

from bench.wrk_nginx import Costed, Pair, WrkResult, bare_rows, more_connections_row, rows_for


def pair(direct: float, proxied: float, *, p50: float = 0.001, errors: int = 0) -> Pair:
    return Pair(WrkResult(direct, p50 / 10, p50, 0), WrkResult(proxied, p50, p50 * 4, errors))


def test_one_round_gives_the_plain_figures() -> None:
    throughput, latency = rows_for(64, [pair(100_000, 8_000)])
    assert throughput.measure == "wrk, 64 connections: throughput"
    assert (throughput.baseline, throughput.llmswap) == ("100,000 req/s", "8,000 req/s")
    assert throughput.ratio == "x0.080"
    assert latency.measure == "wrk, 64 connections: latency p50 / p99"
    assert (latency.baseline, latency.llmswap) == ("0.10 ms / 1.00 ms", "1.00 ms / 4.00 ms")
    assert latency.ratio == "+0.90 ms / +3.00 ms"


def test_the_ratio_is_the_median_of_each_rounds_own() -> None:
    # The second round ran while the machine was slow for both sides: its ratio is as good as the others'.
    runs = [pair(100_000, 8_000), pair(50_000, 4_100), pair(110_000, 8_500, errors=2)]
    throughput, _ = rows_for(16, runs)
    assert throughput.measure == "wrk, 16 connections: throughput, median of 3; errors: direct 0, llmswap 2"
    assert (throughput.baseline, throughput.llmswap) == ("100,000 req/s", "8,000 req/s")
    assert throughput.ratio == "x0.080"  # ratios 0.080, 0.082, 0.077: the median


def test_llmswap_at_256_connections_is_set_against_its_own_64() -> None:
    at_64 = [pair(100_000, 8_000), pair(100_000, 6_000), pair(100_000, 8_400)]
    at_256 = [pair(90_000, 7_600), pair(90_000, 6_300), pair(90_000, 8_000)]
    row = more_connections_row(at_64, at_256)
    assert row.measure == "wrk, llmswap at 256 connections against 64, median of 3"
    assert (row.baseline, row.llmswap) == ("8,000 req/s", "7,600 req/s")
    assert row.ratio == "x0.95"  # rounds: 0.95, 1.05, 0.952


def costed(rate: float, requests: int, cpu: float) -> Costed:
    return Costed(WrkResult(rate, 0.01, 0.02, 0, requests), cpu)


def test_llmswap_is_set_against_a_bare_aiohttp_proxy_in_throughput_and_cpu_per_request() -> None:
    rounds = [  # (llmswap, bare proxy) per round; the second round ran on a slow machine for both
        (costed(1_000, 4_000, 3.2), costed(2_000, 8_000, 4.0)),
        (costed(600, 2_400, 2.4), costed(1_000, 4_000, 2.4)),
        (costed(1_100, 4_400, 3.3), costed(2_000, 8_000, 4.4)),
    ]
    throughput, cpu = bare_rows(rounds)
    assert throughput.measure == ("wrk, 64 connections, against a bare aiohttp proxy: throughput, "
                                  "median of 3")
    assert (throughput.baseline, throughput.llmswap) == ("2,000 req/s", "1,000 req/s")
    assert throughput.ratio == "x0.55"  # rounds: 0.50, 0.60, 0.55
    assert (cpu.baseline, cpu.llmswap) == ("550 µs", "800 µs")  # medians of 500/600/550 and 800/1000/750
    assert cpu.ratio == "x1.45"
