"""`kvCache.save: auto`: a slot is saved when writing and reading it back is expected to beat processing its
tokens again, from rates measured on this machine; pure, no loop, no file."""

from __future__ import annotations

from pathlib import Path

from llmswap.kvcache.rates import KvRates

FOLDER = Path("/kv")
MB = 1_000_000


def measured(prompt_per_second: float, bytes_per_token: int, write: float, read: float) -> KvRates:
    rates = KvRates()
    rates.learn_prompt("m", 2000, prompt_per_second)
    rates.learn_save("m", FOLDER, 1000, 1000 * bytes_per_token, 1000 * bytes_per_token / write)
    rates.learn_restore(FOLDER, 1000 * bytes_per_token, 1000 * bytes_per_token / read)
    return rates


def test_until_every_rate_is_measured_a_slot_is_saved_and_the_reason_names_what_is_missing() -> None:
    rates = KvRates()
    rates.learn_prompt("m", 500, 1000.0)
    choice = rates.choose("m", FOLDER, 30_000, "auto")
    assert choice.save and choice.reason == "not measured yet: bytes per token, save, restore rate"


def test_a_slot_whose_save_costs_more_than_processing_it_again_is_not_saved() -> None:
    # A fast GPU (6,000 tokens/s) and 128 KiB a token on a 500 MB/s disk: 30k tokens are 5 s to process
    # again, 3.9 GB is 15.7 s to write and read back.
    rates = measured(6000.0, 131_072, 500 * MB, 500 * MB)
    choice = rates.choose("m", FOLDER, 30_000, "auto")
    assert not choice.save and choice.redo_seconds == 5.0 and choice.save_seconds is not None
    assert choice.save_seconds > 15
    assert choice.reason.startswith("processing 30000 tokens again (5.00s at 6000 tokens/s) is cheaper")


def test_a_slot_that_is_cheaper_to_save_is_saved_and_always_saves_whatever_the_rates() -> None:
    slow_cpu = measured(200.0, 131_072, 2000 * MB, 4000 * MB)  # a CPU: 150 s to process 30k tokens again
    assert slow_cpu.choose("m", FOLDER, 30_000, "auto").save
    fast_gpu = measured(6000.0, 131_072, 500 * MB, 500 * MB)
    assert fast_gpu.choose("m", FOLDER, 30_000, "always").save


def test_the_prompt_rate_is_weighted_by_tokens_not_averaged_over_answers() -> None:
    rates = KvRates()
    rates.learn_prompt("m", 10, 50.0)  # a 10-token prompt's rate is mostly overhead
    rates.learn_prompt("m", 10_000, 5000.0)
    shown = rates.shown("m", FOLDER)
    assert shown["prompt_tokens_per_second"] == round(10_010 / (0.2 + 2.0), 1)


def test_skips_are_counted_per_model_and_shown_with_the_rates() -> None:
    rates = measured(6000.0, 100, 1000.0, 1000.0)
    rates.skip("m")
    assert rates.shown("m", FOLDER) == {"prompt_tokens_per_second": 6000.0, "bytes_per_token": 100.0,
                                        "save_bytes_per_second": 1000.0, "restore_bytes_per_second": 1000.0,
                                        "skipped_saves": 1}
    assert rates.shown("other", Path("/elsewhere"))["save_bytes_per_second"] is None
