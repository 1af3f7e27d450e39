"""bench.swap_real's arithmetic: phase means from llmswap's metrics, answers compared turn by turn, and the
rows against the best peer (pure: no model, no process)."""

from __future__ import annotations

from bench.swap_penalty import Turn
from bench.swap_real import System, agreeing, phase_means, rows


def system(name: str, total: float, first_token: float, answers: list[str]) -> System:
    made = System(name, turns=[Turn(total, first_token, 10, 0, True, 0)], total=total)
    made.answers = {0: answers}
    return made


def test_phase_means_sum_every_models_series_of_a_phase() -> None:
    metrics = "\n".join([
        'llmswap_swap_phase_seconds_sum{model="a",phase="drain"} 3.0',
        'llmswap_swap_phase_seconds_count{model="a",phase="drain"} 2.0',
        'llmswap_swap_phase_seconds_sum{model="b",phase="drain"} 1.0',
        'llmswap_swap_phase_seconds_count{model="b",phase="drain"} 2.0',
        'llmswap_swap_phase_seconds_bucket{le="1.0",model="b",phase="start"} 1.0',
    ])
    assert phase_means(metrics) == {"drain": 1.0}


def test_answers_are_counted_turn_by_turn_and_rows_read_against_the_best_peer() -> None:
    reference = system("llmswap (kvCache off)", 4.0, 1.0, ["a", "b"])
    mine = system("llmswap", 1.0, 0.25, ["a", "c"])
    assert agreeing(mine, reference) == "1 of 2"
    found = {row.measure: row for row in rows(reference, [mine], reference)}
    assert found["llmswap: total time"].ratio == "x0.25"
    assert found["llmswap: first token after a swap, p50"].llmswap == "250 ms"
    assert found["llmswap: answers equal to llmswap (kvCache off)'s"].llmswap == "1 of 2"
