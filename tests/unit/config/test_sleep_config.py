"""A model's `sleep:` and `wake:` and the top-level `maxSleeping`."""

from __future__ import annotations

from .support import load, one_error

MODEL = """
models:
  big:
    cmd: vllm serve org/model --port ${PORT} --enable-sleep-mode
"""


def test_sleep_and_wake_are_method_and_path() -> None:
    config = load(MODEL + '''    sleep: "POST /sleep?level=1&mode=wait"
    wake: "post /wake_up"
''')
    big = config.models["big"]
    assert big.sleep_call == ("POST", "/sleep?level=1&mode=wait")
    assert big.wake_call == ("POST", "/wake_up")
    assert config.max_sleeping == 2


def test_sleep_without_wake_names_the_fix() -> None:
    error = one_error(MODEL + '    sleep: "POST /sleep"\n')
    assert error.startswith("config.yaml:5: models.big.sleep: sleep needs wake too")
    assert 'add wake: "POST /wake_up"' in error


def test_a_call_that_is_not_method_and_path_is_an_error() -> None:
    error = one_error(MODEL + '    sleep: "/sleep"\n    wake: "POST /wake_up"\n')
    assert error.startswith("config.yaml:5: models.big.sleep: must be METHOD PATH")
    assert "got '/sleep'" in error


def test_max_sleeping_zero_means_never_and_negative_is_an_error() -> None:
    assert load("maxSleeping: 0\n" + MODEL).max_sleeping == 0
    assert "maxSleeping" in one_error("maxSleeping: -1\n" + MODEL)


def test_models_without_sleep_cannot_sleep() -> None:
    big = load(MODEL).models["big"]
    assert big.sleep_call is None and big.wake_call is None


def test_the_vllm_sleep_example_loads_without_warnings() -> None:
    from pathlib import Path

    from llmswap.config import load_config

    config = load_config(Path(__file__).parents[3] / "examples" / "vllm-sleep.yaml")
    assert config.warnings == ()
    assert all(model.sleep_call and model.wake_call for model in config.models.values())
