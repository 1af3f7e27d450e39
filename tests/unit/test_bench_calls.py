"""bench/calls.py's arithmetic: calls sorted by the package whose code makes them, and the rows that set
llmswap's counts beside the bare proxy's (the whole, then each package's share)."""

from __future__ import annotations

from bench.calls import package_of, rows


def test_a_call_belongs_to_the_package_whose_code_it_is_in() -> None:
    assert package_of("/repo/llmswap/server/inference/routes.py") == "llmswap"
    assert package_of("/venv/lib/python3.11/site-packages/aiohttp/web_protocol.py") == "aiohttp"
    assert package_of("/usr/lib/python3.11/asyncio/base_events.py") == "asyncio"
    assert package_of("/venv/lib/python3.11/site-packages/multidict/__init__.py") == "other"


def test_the_rows_give_the_whole_count_then_each_packages_share() -> None:
    bare = {"aiohttp": 300.0, "builtins called from aiohttp": 100.0, "asyncio": 200.0}
    ours = {"aiohttp": 330.0, "builtins called from aiohttp": 110.0, "asyncio": 200.0, "llmswap": 250.0,
            "builtins called from llmswap": 150.0, "other": 60.0}
    whole, llmswap, aiohttp, asyncio, other = rows(bare, ours, 50)
    assert (whole.baseline, whole.llmswap, whole.ratio) == ("600", "1100", "x1.83")
    assert (llmswap.baseline, llmswap.llmswap, llmswap.ratio) == ("0", "400", "n/a")
    assert (aiohttp.baseline, aiohttp.llmswap, aiohttp.ratio) == ("400", "440", "x1.10")
    assert (asyncio.ratio, other.baseline, other.llmswap) == ("x1.00", "0", "60")
    assert "50 sequential" in whole.measure
