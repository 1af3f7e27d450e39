"""`selectors:` and `profiles:`: what loads, and each refusal naming file:line, the entry and the fix."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from llmswap.config import format_config, load_config
from llmswap.config.model import ProfileConfig, SelectorConfig

from .support import errors_of, load, one_error

MODELS = """\
models:
  a: {cmd: "srv --port ${PORT}", aliases: [alpha]}
  b: {cmd: "srv --port ${PORT}"}
  c: {cmd: "srv --port ${PORT}"}
peers:
  lan: {proxy: "http://10.0.0.2:8080", models: [big, a]}
"""
PAIR = """\
groups:
  pair: {swap: false, members: [a, b]}
"""


def test_selectors_load_with_their_defaults_and_listing_fields() -> None:
    config = load(MODELS + PAIR + """\
selectors:
  fast:
    strategy: warm
    targets: [b, alpha]
    name: " Fast "
    description: either
    metadata: {tier: 1}
  fixed: {strategy: pin, targets: [c], unlisted: true}
  spill: {strategy: spillover, targets: [a, b, lan/big], settings: {spillover: 3}}
  remote: {strategy: spillover, targets: [big]}
""")
    assert config.warnings == ()
    assert config.selectors["fast"] == SelectorConfig(
        "fast", "warm", ("b", "alpha"), name="Fast", description="either",
        metadata=MappingProxyType({"tier": 1}), line=10,
    )
    assert config.selectors["fixed"].unlisted and config.selectors["fixed"].spillover == 1
    assert config.selectors["spill"].spillover == 3
    assert config.selectors["remote"].targets == ("big",)


@pytest.mark.parametrize(("selector", "message"), [
    ("a: {strategy: pin, targets: [b]}",
     'config.yaml:8: selectors.a: name conflicts with model ID "a"; rename the selector'),
    ("alpha: {strategy: pin, targets: [b]}",
     'config.yaml:8: selectors.alpha: name conflicts with model alias "alpha" (of a); '
     "rename the selector or the alias"),
    ("lan/big: {strategy: pin, targets: [b]}",
     'config.yaml:8: selectors.lan/big: selector ID "lan/big" conflicts with fully qualified peer model '
     "name; rename the selector"),
    ("s: {targets: [b]}",
     "config.yaml:8: selectors.s: strategy is required; use one of warm, pin, spillover"),
    ("s: {strategy: fastest, targets: [b]}",
     'config.yaml:8: selectors.s.strategy: unknown strategy "fastest" (valid: warm, pin, spillover)'),
    ("s: {strategy: pin}",
     "config.yaml:8: selectors.s: targets must contain at least one entry; list the models to choose from"),
    ("s: {strategy: pin, targets: [nope]}",
     'config.yaml:8: selectors.s.targets[0]: references unknown model "nope"; '
     "use a model id, an alias or <peer>/<model>"),
    ("s: {strategy: warm, targets: [b, big]}",
     'config.yaml:8: selectors.s.targets[1]: "big" is a peer model: it must resolve to a local model for '
     'strategy "warm" (warm reads local process states); use spillover to reach peers'),
    ("s: {strategy: spillover, targets: [b], settings: {spillover: 0}}",
     "config.yaml:8: selectors.s.settings.spillover: must be >= 1, got 0; "
     "it is how many requests the first target takes before the next is used"),
    ("s: {strategy: spillover, targets: [a, alpha]}",
     'config.yaml:8: selectors.s.targets[1]: targets contains duplicate resolved model "a" '
     '(also named by "a"); remove one'),
    ("s: {strategy: spillover, targets: [a, c]}",
     "config.yaml:8: selectors.s.targets: spillover targets must share a group with swap: false "
     "(group (default) swaps); s's local targets must be able to run side by side"),
])
def test_a_bad_selector_is_refused_naming_it_and_the_fix(selector: str, message: str) -> None:
    assert one_error(MODELS + "selectors:\n  " + selector + "\n") == message


def test_a_target_that_is_another_selector_is_refused() -> None:
    errors = errors_of(MODELS + """\
selectors:
  one: {strategy: pin, targets: [a]}
  two: {strategy: warm, targets: [b, one]}
""")
    assert errors == [
        'config.yaml:9: selectors.two.targets[1]: references selector "one"; selector chaining is not '
        "supported: list one's targets here instead"
    ]


def test_spillover_targets_in_a_group_that_does_not_swap_load() -> None:
    config = load(MODELS + PAIR + "selectors:\n  s: {strategy: spillover, targets: [a, b, lan/big]}\n")
    assert config.selectors["s"].targets == ("a", "b", "lan/big")


def test_spillover_targets_must_share_one_group() -> None:
    error = one_error(MODELS + PAIR + "selectors:\n  s: {strategy: spillover, targets: [a, c]}\n")
    assert error.endswith("spillover targets must share one routing group; "
                          "s's local targets must be able to run side by side")


def test_spillover_targets_under_the_matrix_must_appear_in_one_set() -> None:
    matrix = """\
matrix:
  vars: {x: a, y: b, z: c}
  sets: {both: "x & y", alone: "z"}
"""
    ok = load(MODELS + matrix + "selectors:\n  s: {strategy: spillover, targets: [a, b]}\n")
    assert ok.selectors["s"].targets == ("a", "b")
    error = one_error(MODELS + matrix + "selectors:\n  s: {strategy: spillover, targets: [a, c]}\n")
    assert error == ("config.yaml:11: selectors.s.targets: targets must all appear together in one expanded "
                     "matrix set; s's local targets must be able to run side by side")


def test_pin_and_warm_allow_duplicate_targets() -> None:
    config = load(MODELS + "selectors:\n  s: {strategy: warm, targets: [a, alpha, a]}\n")
    assert config.selectors["s"].targets == ("a", "alpha", "a")


def test_profiles_load_with_disabled_pins_and_selector_targets() -> None:
    config = load(MODELS + """\
selectors:
  sel: {strategy: pin, targets: [a]}
profiles:
  work:
    description: office hours
    pins: {chat: sel, b: null, c: "", big-one: lan/big, a: b}
""")
    assert config.profiles["work"] == ProfileConfig(
        "work", "office hours",
        MappingProxyType({"chat": "sel", "b": "", "c": "", "big-one": "lan/big", "a": "b"}),
    )


@pytest.mark.parametrize(("profile", "message"), [
    ("p: [a]",
     "config.yaml:8: profiles.p: profile must be a mapping with description and pins; the legacy list syntax "
     "is no longer supported: write pins: {<name>: <model>}"),
    ("p: {description: x}",
     "config.yaml:8: profiles.p: pins must contain at least one entry; pin a name to a model"),
    ("p: {pins: {x: nope}}",
     'config.yaml:8: profiles.p.pins.x: references unknown model "nope"; pin a model id, an alias, '
     "a peer model or a selector (pins do not chain)"),
    ("p: {pins: {x: a, y: x}}",
     'config.yaml:8: profiles.p.pins.y: references unknown model "x"; pin a model id, an alias, '
     "a peer model or a selector (pins do not chain)"),
    ("p: {pins: {lan/big: a}}",
     'config.yaml:8: profiles.p.pins.lan/big: profile p pin "lan/big" conflicts with fully qualified peer '
     "model name; pin a different name"),
])
def test_a_bad_profile_is_refused_naming_it_and_the_fix(profile: str, message: str) -> None:
    assert one_error(MODELS + "profiles:\n  " + profile + "\n") == message


def test_check_config_output_shows_selectors_and_profiles() -> None:
    config = load(MODELS + """\
selectors:
  s: {strategy: spillover, targets: [a, lan/big], settings: {spillover: 2}, name: S}
profiles:
  p: {pins: {x: s, b: null}}
""")
    shown = yaml.safe_load(format_config(config))
    assert shown["selectors"] == {"s": {"strategy": "spillover", "targets": ["a", "lan/big"],
                                        "settings": {"spillover": 2}, "name": "S"}}
    assert shown["profiles"] == {"p": {"description": "", "pins": {"x": "s", "b": ""}}}


def test_the_example_config_has_working_selectors_and_profiles() -> None:
    example = Path(__file__).parents[3] / "config.example.yaml"
    environ = {"LLMSWAP_API_KEY": "sk-example-key-0123", "OPENROUTER_API_KEY": "x"}
    config = load_config(example, environ=environ)
    assert config.selectors["coding-model"].targets == ("qwen3-8b", "openrouter/deepseek/deepseek-v3.2")
    assert config.profiles["offline"].pins["deepseek/deepseek-v3.2"] == ""


LLAMA_SWAP_EXAMPLE = Path(__file__).parent / "data" / "llama-swap-example.yaml"
LLAMA_SWAP_ENV = {"HOME": "/home/user", "API_KEY_1": "sk-one-0123", "OPENROUTER_API_KEY": "sk-or-0123"}


def test_a_llama_swap_example_config_with_selectors_and_profiles_loads_silently() -> None:
    config = load_config(LLAMA_SWAP_EXAMPLE, environ=LLAMA_SWAP_ENV)
    assert config.warnings == ()
    assert config.routing.router.use == "matrix"
    assert {s.id: (s.strategy, s.targets) for s in config.selectors.values()} == {
        "coding-model": ("warm", ("qwen-model", "gemma-model")),
        "chat": ("pin", ("gpt-4o-mini",)),
        "overflow": ("spillover", ("gemma-model", "openrouter/z-ai/glm-4.7")),
        "pair": ("spillover", ("qwen-model", "reranker-model")),
    }
    assert config.selectors["overflow"].spillover == 2 and config.selectors["pair"].unlisted
    assert dict(config.profiles["cheap"].pins) == {"chat": "qwen-model", "gpt-oss-120b": ""}


def test_a_selector_in_preload_is_skipped_with_a_warning() -> None:
    config = load(MODELS + """\
selectors:
  s: {strategy: pin, targets: [a]}
hooks: {on_startup: {preload: [s, b]}}
""")
    assert config.preload == ("b",)
    assert config.warnings == (
        'config.yaml:9: hooks.on_startup.preload[0]: "s" is a selector, not preloaded; '
        "list the model to load",
    )


def test_a_startup_profile_is_read_and_shown_and_must_name_a_profile() -> None:
    config = load(MODELS + """\
profiles:
  cheap: {pins: {chat: a}}
hooks: {on_startup: {profile: cheap, preload: [b]}}
""")
    assert (config.startup_profile, config.preload) == ("cheap", ("b",))
    shown = yaml.safe_load(format_config(config))
    assert shown["hooks"] == {"on_startup": {"preload": ["b"], "profile": "cheap"}}
    assert one_error(MODELS + """\
profiles:
  cheap: {pins: {chat: a}}
hooks:
  on_startup:
    profile: dear
""") == ('config.yaml:11: hooks.on_startup.profile: "dear" is not a profile; name one of profiles: (cheap)')
    assert load(MODELS).startup_profile is None
