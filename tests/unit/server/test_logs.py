"""Log ids, merged history and the text body of the log routes (no event loop)."""

import itertools

from llmswap.config.model import Config, ModelConfig
from llmswap.process.logring import LogRing
from llmswap.server.observe.logs import as_text, merged_history, rings_for


def ticking_clock(start: float = 100.0):
    counter = itertools.count()
    return lambda: start + next(counter)


def test_merged_history_orders_lines_by_time_across_rings():
    clock = ticking_clock()
    proxy, upstream = LogRing("proxy", wall_clock=clock), LogRing("upstream", wall_clock=clock)
    proxy.append("p1")
    upstream.append("u1")
    upstream.append("u2")
    proxy.append("p2")
    assert merged_history([proxy, upstream]) == ["p1", "u1", "u2", "p2"]


def test_lines_with_the_same_time_keep_ring_order():
    proxy, upstream = LogRing("proxy", wall_clock=lambda: 5.0), LogRing("upstream", wall_clock=lambda: 5.0)
    upstream.append("u")
    proxy.append("p")
    assert merged_history([proxy, upstream]) == ["p", "u"]


def test_text_body_is_one_line_each():
    assert as_text(["a", "b é"]) == "a\nb é\n".encode()
    assert as_text([]) == b""


class StubRouter:
    def __init__(self, processes):
        self.processes = processes
        self.upstream_log = LogRing("upstream")


class StubProcess:
    def __init__(self, name):
        self.logs = LogRing(name)


def test_log_ids_name_proxy_upstream_models_and_aliases():
    from llmswap.server.state import ServerState

    model = ModelConfig(id="m", cmd=("x",))
    router = StubRouter({"m": StubProcess("m")})
    server = ServerState(config=Config(models={"m": model}, aliases={"alias": "m"}), router=router)
    assert rings_for(server, "") == [server.proxy_log, router.upstream_log]
    assert rings_for(server, "proxy") == [server.proxy_log]
    assert rings_for(server, "upstream") == [router.upstream_log]
    assert rings_for(server, "m") == [router.processes["m"].logs]
    assert rings_for(server, "alias") == [router.processes["m"].logs]
    assert rings_for(server, "nope") is None
