"""bench/wrk_nginx.py reads wrk's report: requests per second, the 50% and 99% latencies, and its errors."""

from __future__ import annotations

import pytest

from bench.wrk_nginx import parse_wrk

WRK_REPORT = """Running 5s test @ http://127.0.0.1:8080/v1/chat/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    10.52ms    2.01ms  40.11ms   90.12%
    Req/Sec     6.12k   301.55     6.50k    80.00%
  Latency Distribution
     50%   10.20ms
     75%   11.01ms
     90%   12.50ms
     99%    1.02s
  30455 requests in 5.00s, 9.87MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec:   6091.00
Transfer/sec:      1.97MB
"""


def test_parse_wrk_reads_rate_percentiles_and_every_error() -> None:
    result = parse_wrk(WRK_REPORT)
    assert result.requests_per_second == 6091.0
    assert result.p50 == pytest.approx(0.0102)
    assert result.p99 == pytest.approx(1.02)
    assert result.errors == 2 + 3 + 7
    assert result.requests == 30455


def test_parse_wrk_reads_microseconds_and_a_clean_run() -> None:
    report = WRK_REPORT.replace("10.20ms", "812.00us").split("  Socket errors")[0] + "Requests/sec: 10.5\n"
    result = parse_wrk(report)
    assert result.p50 == pytest.approx(812e-6)
    assert result.errors == 0


def test_parse_wrk_without_a_latency_distribution_says_what_it_saw() -> None:
    with pytest.raises(SystemExit, match="no Requests/sec or latency distribution"):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")
