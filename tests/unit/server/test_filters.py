"""Request-body filters: llama-swap's order, sjson-style paths, and never touching the client's body."""

from __future__ import annotations

import copy
from types import MappingProxyType

from llmswap.config.model import Filters
from llmswap.upstream.filters import FilterPlan, apply_plan, delete_path, plan_for, set_path, split_path


def filters(
    strip: tuple[str, ...] = (), set_params: dict | None = None, by_id: dict | None = None
) -> Filters:
    return Filters(
        strip_params=strip,
        set_params=MappingProxyType(set_params or {}),
        set_params_by_id=MappingProxyType(by_id or {}),
    )


def test_plan_orders_use_model_name_strip_set_then_set_by_id() -> None:
    plan = plan_for(
        filters(
            strip=("top_k",), set_params={"temperature": 0.2, "b": 1}, by_id={"fast": {"temperature": 0.9}}
        ),
        "fast",
        model="qwen-upstream",
    )
    assert plan == FilterPlan(
        model="qwen-upstream", strip=("top_k",), set=(("b", 1), ("temperature", 0.2), ("temperature", 0.9))
    )
    body, changed = apply_plan({"model": "fast", "top_k": 40, "temperature": 1.0}, plan)
    assert changed
    assert body == {"model": "qwen-upstream", "temperature": 0.9, "b": 1}


def test_set_params_by_id_applies_only_to_the_requested_name() -> None:
    plan = plan_for(filters(by_id={"fast": {"temperature": 0.9}}), "slow")
    assert plan.empty
    body, changed = apply_plan({"model": "slow", "temperature": 1.0}, plan)
    assert not changed and body == {"model": "slow", "temperature": 1.0}


def test_model_is_never_stripped_or_set_by_params() -> None:
    plan = plan_for(filters(strip=("model",), set_params={"model": "x"}, by_id={"a": {"model": "y"}}), "a")
    assert plan.empty


def test_nested_paths_create_objects_and_delete_leaves() -> None:
    body = {"model": "m", "chat_template_kwargs": {"enable_thinking": True, "keep": 1}}
    plan = FilterPlan(strip=("chat_template_kwargs.enable_thinking",), set=(("options.sampler.seed", 7),))
    result, changed = apply_plan(body, plan)
    assert changed
    assert result == {"model": "m", "chat_template_kwargs": {"keep": 1}, "options": {"sampler": {"seed": 7}}}


def test_client_body_is_not_modified() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "opts": {"a": 1}}
    before = copy.deepcopy(body)
    plan = FilterPlan(model="other", strip=("opts.a", "messages.0.role"), set=(("opts.b", {"c": [1]}),))
    result, changed = apply_plan(body, plan)
    assert changed
    assert body == before
    assert result == {"model": "other", "messages": [{"content": "hi"}], "opts": {"b": {"c": [1]}}}


def test_set_value_is_copied_so_later_edits_do_not_leak_into_config() -> None:
    shared = {"list": [1]}
    result, _ = apply_plan({}, FilterPlan(set=(("x", shared),)))
    result["x"]["list"].append(2)
    assert shared == {"list": [1]}


def test_unchanged_when_filters_reproduce_the_body() -> None:
    result, changed = apply_plan({"model": "m", "t": 1}, FilterPlan(model="m", set=(("t", 1),)))
    assert not changed and result == {"model": "m", "t": 1}


def test_escaped_dot_is_part_of_the_key() -> None:
    assert split_path(r"a.b\.c.d") == ["a", "b.c", "d"]
    target: dict = {}
    set_path(target, split_path(r"opts.qwen3\.preserve"), False)
    assert target == {"opts": {"qwen3.preserve": False}}


def test_array_indexes_and_append() -> None:
    target = {"stop": ["a", "b"], "n": 5}
    set_path(target, ["stop", "1"], "B")
    set_path(target, ["stop", "-1"], "c")
    set_path(target, ["stop", "9"], "ignored")  # out of range: the array is left alone
    delete_path(target, ["stop", "0"])
    assert target["stop"] == ["B", "c"]
    set_path(target, ["n", "x"], 1)  # a scalar on the way is replaced by an object
    assert target["n"] == {"x": 1}


def test_strip_of_missing_paths_is_a_no_op() -> None:
    target = {"a": {"b": 1}, "s": "text"}
    delete_path(target, ["missing"])
    delete_path(target, ["a", "missing", "deeper"])
    delete_path(target, ["s", "inner"])
    delete_path(target, ["a", "b", "c"])
    assert target == {"a": {"b": 1}, "s": "text"}


def test_a_plan_follows_the_name_the_client_sent() -> None:
    mine = filters(set_params={"temperature": 0.2}, by_id={"fast": {"temperature": 0.9}})
    assert plan_for(mine, "fast") == FilterPlan(set=(("temperature", 0.2), ("temperature", 0.9)))
    assert plan_for(mine, "slow") == FilterPlan(set=(("temperature", 0.2),))


def test_no_filters_and_no_rename_is_the_empty_plan() -> None:
    assert plan_for(filters(), "any", model=None).empty
    assert plan_for(filters(), "any", model="renamed") == FilterPlan(model="renamed")
