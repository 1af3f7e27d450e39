"""The matrix set language and its solver: llama-swap's worked examples M1-M15, compile errors,
and a property test against a brute-force expansion."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmswap.config.matrix_dsl import (
    AllOf,
    AnyOf,
    Leaf,
    MatrixError,
    MatrixProgram,
    Node,
    Ref,
    compile_matrix,
    parse_set,
)
from llmswap.scheduler.swappers.matrix import MatrixSwapper

NAMED_MODELS = ["gemma", "qwen", "mistral", "voxtral", "llama70B", "reranker"]
VARS_BASIC = {"g": "gemma", "q": "qwen", "m": "mistral", "v": "voxtral", "L": "llama70B", "e": "reranker"}


def program(sets, *, vars=None, costs=None, models=None) -> MatrixProgram:
    sets = list(sets.items()) if isinstance(sets, dict) else list(sets)
    if models is None:
        models = set(NAMED_MODELS)
        for _, text in sets:
            for symbol in "()&|":
                text = text.replace(symbol, " ")
            models.update(tok for tok in text.split() if not tok.startswith("+"))
    return compile_matrix(vars or {}, sets, costs or {}, models)


M15_CHOICES = [f"({' | '.join(f'm-{i}-{j}' for j in range(10))})" for i in range(6)]
M15_SETS = {"big": " & ".join(["target", *M15_CHOICES])}  # 10^6 combinations, never expanded

# id, sets, vars, costs, running, target, set, members (None = not checked), evict, cost
EXAMPLES = [
    ("M1", {"s_a": "a", "s_b": "b"}, None, None, ["a"], "b", "s_b", ("b",), ("a",), 1),
    ("M2", {"s_ab": "a & b"}, None, None, ["a"], "b", "s_ab", ("a", "b"), (), 0),
    ("M3", {"s_ab": "a & b"}, None, None, ["a"], "b", "s_ab", ("a", "b"), (), 0),
    ("M4", {"s_a": "a", "s_b": "b"}, None, None, ["a"], "b", "s_b", ("b",), ("a",), 1),
    ("M5", {"first": "a & b", "second": "a & c"}, None, None, [], "a", "first", ("a", "b"), (), 0),
    (
        "M6",
        {"a_with_c": "a & c", "a_with_b": "a & b"},
        None,
        {"b": 10, "c": 1},
        ["b", "c"],
        "a",
        "a_with_b",
        ("a", "b"),
        ("c",),
        1,
    ),
    (
        "M7",
        {"standard": "(g | q | m) & v", "full": "L"},
        VARS_BASIC,
        {"L": 30, "v": 50},
        ["voxtral"],
        "gemma",
        "standard",
        ("gemma", "voxtral"),
        (),
        0,
    ),
    (
        "M8",
        {"standard": "(g | q | m) & v", "full": "L"},
        VARS_BASIC,
        {"L": 30, "v": 50},
        ["voxtral"],
        "llama70B",
        "full",
        ("llama70B",),
        ("voxtral",),
        50,
    ),
    (
        "M9",
        {"llms": "g|q|m", "with_tts": "+llms & v", "mega": "+with_tts & e"},
        VARS_BASIC,
        None,
        ["gemma", "voxtral"],
        "reranker",
        "mega",
        ("gemma", "reranker", "voxtral"),
        (),
        0,
    ),
    (
        "M10",
        {"base": "g | qwen", "combo": "+base & voxtral"},
        {"g": "gemma"},
        None,
        ["voxtral"],
        "qwen",
        "combo",
        ("qwen", "voxtral"),
        (),
        0,
    ),
    ("M11", {"combo": "qwen"}, {"qwen": "gemma"}, None, [], "gemma", "combo", ("gemma",), (), 0),
    (
        "M12",
        {"base": "a & b", "extended": "target & +base & b"},
        None,
        None,
        ["a", "b"],
        "target",
        "extended",
        ("a", "b", "target"),
        (),
        0,
    ),
    ("M13", {"s": "target & (a | (a & b))"}, None, None, ["a", "b"], "target", "s", ("a", "b", "target"),
     (), 0),
    ("M14", {"known": "a & b"}, None, None, ["a", "b"], "missing", None, ("missing",), ("a", "b"), 2),
    (
        "M15",
        M15_SETS,
        None,
        None,
        [f"m-{i}-9" for i in range(6)] + ["outside"],
        "target",
        "big",
        tuple(sorted(["target"] + [f"m-{i}-9" for i in range(6)])),
        ("outside",),
        1,
    ),
]


@pytest.mark.parametrize(
    ("sets", "vars", "costs", "running", "target", "set_name", "members", "evict", "cost"),
    [pytest.param(*example[1:], id=example[0]) for example in EXAMPLES],
)
def test_matrix_worked_examples(sets, vars, costs, running, target, set_name, members, evict, cost):
    prog = program(sets, vars=vars, costs=costs)
    solution = prog.solve(target, running)
    assert solution.set_name == set_name
    assert solution.members == members
    assert solution.evict == evict
    assert solution.cost == cost
    assert MatrixSwapper(prog).evictions_for(target, running) == list(evict)


def test_matrix_m11_var_takes_precedence_over_a_model_of_the_same_name():
    prog = program({"combo": "qwen"}, vars={"qwen": "gemma"})
    assert prog.solve("qwen", []).set_name is None  # the identifier `qwen` means gemma


def test_matrix_target_already_running_evicts_nothing():
    prog = program({"s_a": "a", "s_b": "b"})
    solution = prog.solve("a", ["a", "b"])
    assert solution.evict == () and solution.cost == 0


def test_matrix_target_running_names_a_set_holding_the_running_models_for_the_log():
    prog = program({"solo": "a", "pair": "a & b"})
    assert prog.solve("a", ["a", "b"]).set_name == "pair"
    assert prog.solve("a", ["a", "c"]).set_name is None


def test_matrix_ties_go_to_the_earlier_combination_in_a_set():
    prog = program({"s": "a & (b | c)"})
    assert prog.solve("a", ["b", "c"]).evict == ("c",)
    prog = program({"s": "a & (c | b)"})
    assert prog.solve("a", ["b", "c"]).evict == ("b",)


def test_matrix_cheapest_set_wins_over_definition_order():
    prog = program({"first": "a & b", "second": "a & c & d"})
    assert prog.solve("a", ["c", "d"]).set_name == "second"


def test_matrix_evict_costs_accept_vars_and_model_ids():
    prog = program({"s": "g"}, vars={"g": "gemma", "v": "voxtral"}, costs={"v": 7, "qwen": 3})
    assert dict(prog.evict_costs) == {"voxtral": 7, "qwen": 3}
    assert prog.solve("gemma", ["voxtral", "qwen", "mistral"]).cost == 11


def test_matrix_compiled_order_puts_references_first():
    sets = {"mega": "+with_tts & e", "full": "L", "with_tts": "+llms & v", "llms": "g|q|m"}
    prog = program(sets, vars=VARS_BASIC)
    assert [name for name, _ in prog.sets] == ["llms", "with_tts", "mega", "full"]
    assert prog.sets[0] == ("llms", "g|q|m")
    assert dict(prog.vars) == VARS_BASIC


def test_matrix_program_is_immutable():
    prog = program({"s": "a"})
    with pytest.raises(AttributeError):
        prog.sets = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        prog.evict_costs["a"] = 5  # type: ignore[index]


def test_matrix_swapper_logs_only_when_a_swap_starts(caplog):
    prog = program({"standard": "(g | q | m) & v", "full": "L"}, vars=VARS_BASIC, costs={"v": 50})
    swapper = MatrixSwapper(prog, logging.getLogger("test.matrix"))
    with caplog.at_level(logging.INFO, logger="test.matrix"):
        swapper.evictions_for("llama70B", ["voxtral"])
        assert caplog.records == []
        swapper.on_swap_start("llama70B", ["voxtral"])
    assert caplog.messages == ["matrix: model=llama70B set=full dsl=L evict=[voxtral] cost=50"]


def test_matrix_parse_builds_the_tree_with_precedence():
    root = parse_set("s", "a | b & (c | +d)")
    assert isinstance(root, AnyOf)
    left, right = root.children
    assert isinstance(left, Leaf) and left.name == "a" and left.column == 1
    assert isinstance(right, AllOf)
    inner = right.children[1]
    assert isinstance(inner, AnyOf)
    ref = inner.children[1]
    assert isinstance(ref, Ref) and (ref.name, ref.column) == ("d", 14)


@pytest.mark.parametrize(
    ("dsl", "message"),
    [
        ("", 'set "s": empty DSL expression'),
        ("   ", 'set "s": empty DSL expression'),
        ("(a | b", 'set "s": missing closing parenthesis at column 7'),
        ("(a | b & c", 'set "s": missing closing parenthesis at column 11'),
        ("((a) & b c", 'set "s": missing closing parenthesis at column 10'),
        ("a & ", 'set "s": unexpected end of expression at column 5'),
        ("a | | b", 'set "s": unexpected token "|" at column 5'),
        (") a", 'set "s": unexpected token ")" at column 1'),
        ("a b", 'set "s": unexpected token "b" after expression at column 3'),
        ("a ) b", 'set "s": unexpected token ")" after expression at column 3'),
        ("a & !b", "set \"s\": unexpected character '!' at column 5"),
        ("a, b", "set \"s\": unexpected character ',' at column 2"),
        ("org/model", "set \"s\": unexpected character '/' at column 4"),
        ("a & +", "set \"s\": expected set name after '+' at column 6"),
        ("a & + b", "set \"s\": expected set name after '+' at column 6"),
    ],
)
def test_matrix_dsl_syntax_errors_name_the_set_and_column(dsl, message):
    with pytest.raises(MatrixError) as info:
        program({"s": dsl}, models={"a", "b", "c"})
    assert str(info.value) == message
    assert info.value.path == ("sets", "s")


def _bad_cost(value: object, shown: str):
    message = f'evict_cost for "a" must be a positive integer, got {shown}'
    return pytest.param({}, [("s", "a")], {"a": value}, message, ("evict_costs", "a"), id=f"cost={shown}")


@pytest.mark.parametrize(
    ("vars", "sets", "costs", "message", "path"),
    [
        ({}, [], {}, "matrix must define at least one set", ()),
        (
            {"bad_key": "a"},
            [("s", "a")],
            {},
            "var key \"bad_key\" must contain only alphanumeric, '-' or '.' characters and be 1-32 "
            "characters long",
            ("vars", "bad_key"),
        ),
        (
            {"x" * 33: "a"},
            [("s", "a")],
            {},
            f"var key \"{'x' * 33}\" must contain only alphanumeric, '-' or '.' characters and be 1-32 "
            "characters long",
            ("vars", "x" * 33),
        ),
        ({"g": "ghost"}, [("s", "a")], {}, 'var key "g" references unknown model "ghost"', ("vars", "g")),
        ({}, [("s", "a & ghost")], {}, 'set "s": unknown var or model "ghost" at column 5', ("sets", "s")),
        ({}, [("s", "a & +nope")], {}, 'set "s" references undefined set "nope" at column 5', ("sets", "s")),
        ({}, [("s", "a | +s")], {}, 'circular reference detected involving set "s"', ("sets", "s")),
        (
            {},
            [("x", "+y & a"), ("y", "b | +z"), ("z", "+x")],
            {},
            'circular reference detected involving set "x"',
            ("sets", "x"),
        ),
        _bad_cost(0, "0"),
        _bad_cost(-4, "-4"),
        _bad_cost("5", "'5'"),
        _bad_cost(True, "True"),
        _bad_cost(2.5, "2.5"),
        ({}, [("s", "a")], {"ghost": 3},
         'evict_costs: unknown var or model "ghost"', ("evict_costs", "ghost")),
        ({}, [("s", "a"), ("s", "b")], {}, 'set "s" is defined twice', ("sets", "s")),
        ({}, [("s", 5)], {}, 'set "s": expression must be a string, got int', ("sets", "s")),
    ],
)
def test_matrix_compile_errors(vars, sets, costs, message, path):
    with pytest.raises(MatrixError) as info:
        compile_matrix(vars, sets, costs, {"a", "b"})
    assert str(info.value) == message
    assert info.value.path == path
    assert isinstance(info.value, ValueError)


def test_matrix_identifiers_accept_unicode_letters_digits_and_punctuation():
    prog = compile_matrix({}, [("s", "qwen2.5-7b_q4 & modèle")], {}, {"qwen2.5-7b_q4", "modèle"})
    assert prog.solve("modèle", ["qwen2.5-7b_q4"]).evict == ()


def test_matrix_var_key_rules_allow_dots_and_dashes():
    prog = compile_matrix({"qwen-2.5": "a"}, [("s", "qwen-2.5")], {}, {"a"})
    assert prog.solve("a", []).set_name == "s"


# ================================================================ property: solver vs brute force

MODELS = ["a", "b", "c", "d", "e"]


def _expressions(max_leaves: int = 6) -> st.SearchStrategy[str]:
    leaf = st.sampled_from(MODELS)

    def extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        joined = st.tuples(st.sampled_from([" & ", " | "]), st.lists(children, min_size=2, max_size=3))
        return joined.map(lambda pair: "(" + pair[0].join(pair[1]) + ")")

    return st.recursive(leaf, extend, max_leaves=max_leaves)


@st.composite
def _matrices(draw):
    count = draw(st.integers(min_value=1, max_value=3))
    sets = []
    for index in range(count):
        text = draw(_expressions())
        if index > 0 and draw(st.booleans()):
            ref = f"s{draw(st.integers(min_value=0, max_value=index - 1))}"
            text = f"{text} {draw(st.sampled_from(['&', '|']))} +{ref}"
        sets.append((f"s{index}", text))
    costs = draw(st.dictionaries(st.sampled_from(MODELS), st.integers(min_value=1, max_value=6)))
    running = draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=4))
    target = draw(st.sampled_from([*MODELS, "f"]))  # "f" is in no set: it must run alone
    return sets, costs, running, target


def _expand(node: Node, linked: dict[str, Node]) -> list[frozenset[str]]:
    """Every combination, in traversal order: the definition the solver must agree with."""
    if isinstance(node, Leaf):
        return [frozenset([node.name])]
    if isinstance(node, Ref):
        return _expand(linked[node.name], linked)
    if isinstance(node, AnyOf):
        return [combo for child in node.children for combo in _expand(child, linked)]
    combos = [frozenset()]
    for child in node.children:
        combos = [left | right for left in combos for right in _expand(child, linked)]
    return combos


def _brute_force(sets: Sequence[tuple[str, str]], order: Sequence[str], costs, running, target):
    parsed = {name: parse_set(name, text) for name, text in sets}
    best = None
    for name in order:
        for combo in _expand(parsed[name], parsed):
            if target not in combo:
                continue
            cost = sum(costs.get(r, 1) for r in running if r not in combo)
            if best is None or cost < best[0]:
                best = (cost, name, combo)
    return best


@settings(max_examples=150, deadline=None)
@given(_matrices())
def test_matrix_solver_never_costlier_than_any_valid_combination(case):
    sets, costs, running, target = case
    prog = compile_matrix({}, sets, costs, [*MODELS, "f"])
    solution = prog.solve(target, running)
    order = [name for name, _ in prog.sets]
    best = _brute_force(sets, order, costs, running, target)

    assert target in solution.members
    if target in running:
        assert solution.evict == () and solution.cost == 0
        return
    assert solution.evict == tuple(r for r in running if r not in solution.members)
    assert solution.cost == sum(costs.get(r, 1) for r in solution.evict)
    if best is None:
        assert solution.set_name is None
        assert solution.evict == tuple(running) and solution.members == (target,)
        return
    best_cost, best_set, best_combo = best
    assert solution.cost == best_cost
    # Ties: the set defined first, then the combination met first in that set.
    assert solution.set_name == best_set
    assert solution.evict == tuple(r for r in running if r not in best_combo)
    # The members are one real combination of the chosen set.
    parsed = {name: parse_set(name, text) for name, text in sets}
    assert frozenset(solution.members) in _expand(parsed[best_set], parsed)
