"""bench/beside_llama_swap.py's rows: the latency llmswap and llama-swap each add over the direct request at
the same percentile, their ratio, chunks per second against both baselines, CPU per request against the
bare proxy; without a llama-swap binary its rows say they were skipped and why. And bench/beside_build.py's:
this checkout against another build, CPU by paired rounds."""

from __future__ import annotations

from bench import beside_build
from bench.beside_llama_swap import Side, rows


def side(name: str, latency: float, chunks: float = 1000.0, cpu: float = 0.0) -> Side:
    return Side(name, "http://unused", latencies=[latency] * 10, chunk_rates=[chunks, chunks * 2, chunks / 2],
                cpu_per_request=[cpu] * 3)


def test_added_latency_is_each_proxys_time_minus_the_direct_time() -> None:
    direct = side("direct", 0.001, chunks=5000)
    llmswap = side("llmswap", 0.0015, chunks=4000, cpu=0.0003)
    llama_swap = side("llama-swap", 0.002, chunks=2000)
    bare = side("bare", 0.0, cpu=0.0002)
    table = rows(direct, llmswap, bare, llama_swap, 10, 64, 2000)
    p50 = table[0]
    assert (p50.baseline, p50.llmswap, p50.ratio) == ("1.00 ms", "0.50 ms", "x0.50")
    chunks = table[2]
    assert (chunks.baseline, chunks.llmswap, chunks.ratio) == ("2,000 chunk/s", "4,000 chunk/s", "x2.00")
    assert table[3].ratio == "x0.80"  # against the upstream read directly
    cpu = table[4]
    assert (cpu.baseline, cpu.llmswap, cpu.ratio) == ("200 us", "300 us", "x1.50")


def test_without_llama_swap_its_rows_say_skipped() -> None:
    direct, llmswap, bare = side("direct", 0.001), side("llmswap", 0.0015), side("bare", 0.0)
    table = rows(direct, llmswap, bare, None, 10, 64, 2000)
    skipped = [row for row in table if row.against.startswith("skipped")]
    assert len(skipped) == 3 and all("llama-swap" in row.against for row in skipped)
    assert table[-1].ratio  # the CPU row is measured whatever llama-swap


def test_beside_build_pairs_each_round_of_this_checkout_with_the_other_builds() -> None:
    assert beside_build.paired_ratios([2.0, 3.0, 4.0], [1.0, 2.0]) == [2.0, 1.5]
    assert beside_build.paired_ratios([1.0], [0.0]) == []
    direct = side("direct", 0.001)
    ours = Side("ours", "http://x", latencies=[0.0014] * 10, cpu_per_request=[300e-6, 600e-6, 330e-6])
    theirs = Side("theirs", "http://x", latencies=[0.0015] * 10, cpu_per_request=[400e-6, 800e-6, 300e-6])
    table = beside_build.rows("abc123", direct, ours, theirs, 10)
    assert table[0].against == "llmswap at abc123, same run"
    assert (table[0].baseline, table[0].llmswap, table[0].ratio) == ("0.50 ms", "0.40 ms", "x0.80")
    cpu = table[2]
    assert cpu.ratio == "x0.75"  # the median of 0.75, 0.75, 1.10: a slow round of both leaves it alone
    assert "by round 0.75..1.10" in cpu.measure
