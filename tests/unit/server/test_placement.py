"""Where a model served here and on discover peers goes: the pure rule, no process."""

from __future__ import annotations

from llmswap.server.inference.placement import LOCAL, HostView, ModelView, place

GIB = 1024**3


def host(name: str, *, free: int | None = None, fresh: bool = True, **models: ModelView) -> HostView:
    return HostView(name, dict(models), free, fresh)


def test_ready_with_room_wins_over_cold_here() -> None:
    here = host(LOCAL, m=ModelView("stopped"))
    placed = place("m", here, [host("b", m=ModelView("ready"))])
    assert (placed.host, placed.reason) == ("b", "ready with room on b")


def test_a_ready_model_with_a_queue_is_not_ready_with_room() -> None:
    here = host(LOCAL, free=10 * GIB, m=ModelView("stopped"))
    placed = place("m", here, [host("b", free=1 * GIB, m=ModelView("ready", in_flight=1, waiting=3))])
    assert placed.host == LOCAL and placed.reason == "loads on this host evicting nothing busy"


def test_a_load_that_evicts_nothing_busy_beats_one_that_would() -> None:
    here = host(LOCAL, m=ModelView("stopped"), other=ModelView("ready", in_flight=2))
    placed = place("m", here, [host("b", m=ModelView("stopped"))])
    assert placed.host == "b"


def test_everyone_busy_the_most_free_memory_then_fewest_in_flight_then_name() -> None:
    busy = ModelView("ready", in_flight=1)
    here = host(LOCAL, free=2 * GIB, m=ModelView("stopped"), x=busy)
    peers = [host("c", free=8 * GIB, m=ModelView("stopped"), x=busy),
             host("b", free=8 * GIB, m=ModelView("stopped"), x=busy)]
    assert place("m", here, peers).host == "b"  # tie on memory and in flight: by name
    peers[0].models["x"] = ModelView("ready", in_flight=0, waiting=1)
    assert place("m", here, peers).host == "c"  # fewer in flight
    assert place("m", here, peers).reason == "most free memory on c"


def test_a_full_tie_stays_here() -> None:
    assert place("m", host(LOCAL, m=ModelView("ready")), [host("b", m=ModelView("ready"))]).host == LOCAL


def test_a_stale_peer_is_skipped_and_said_so() -> None:
    placed = place("m", host(LOCAL, m=ModelView("stopped")), [host("b", fresh=False, m=ModelView("ready"))])
    assert placed.host == LOCAL and placed.reason.endswith("; b down or stale")


def test_a_model_ready_here_stays_here_whatever_a_ready_peer_has_free() -> None:
    here = host(LOCAL, free=1 * GIB, m=ModelView("ready"))
    placed = place("m", here, [host("b", free=70 * GIB, m=ModelView("ready"))])
    assert (placed.host, placed.reason) == (LOCAL, "ready with room on this host")


def test_among_ready_peers_the_fewest_in_flight_not_the_most_memory() -> None:
    here = host(LOCAL, m=ModelView("stopped"), x=ModelView("ready", in_flight=1))
    peers = [host("b", free=70 * GIB, m=ModelView("ready", in_flight=2)),
             host("c", free=1 * GIB, m=ModelView("ready"))]
    assert place("m", here, peers).host == "c"


def test_an_idle_host_here_loads_it_rather_than_an_idle_peer_with_more_memory() -> None:
    here = host(LOCAL, free=1 * GIB, m=ModelView("stopped"))
    assert place("m", here, [host("b", free=70 * GIB, m=ModelView("stopped"))]).host == LOCAL


def test_unknown_free_memory_is_not_zero() -> None:
    busy = ModelView("ready", in_flight=3)
    here = host(LOCAL, free=None, m=ModelView("stopped"), x=ModelView("ready", in_flight=1))
    peers = [host("b", free=70 * GIB, m=ModelView("stopped"), x=busy)]
    # Memory cannot be compared with a host that does not know its own: fewer in flight decides.
    assert place("m", here, peers).host == LOCAL
    # Between hosts that all report it, memory decides before the requests in flight.
    peers.append(host("c", free=80 * GIB, m=ModelView("stopped"), x=busy))
    assert place("m", host(LOCAL, free=2 * GIB, m=ModelView("stopped"), x=busy), peers).host == "c"
