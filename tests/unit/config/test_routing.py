"""`routing:` and the legacy top-level `groups:` / `matrix:`: routers, groups, matrix, vram, scheduler."""

from __future__ import annotations

import pytest

from llmswap.config import DEFAULT_GROUP_ID, AdmissionConfig, GroupConfig

from .support import errors_of, load, one_error

MODELS = """\
models:
  a: {cmd: "srv --port ${PORT}", aliases: [alpha]}
  b: {cmd: "srv --port ${PORT}"}
  c: {cmd: "srv --port ${PORT}"}
  d: {cmd: "srv --port ${PORT}"}
"""


def test_no_groups_puts_every_model_in_the_default_group() -> None:
    router = load(MODELS).routing.router
    assert router.use == "group"
    assert dict(router.groups) == {
        DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=("a", "b", "c", "d"))
    }
    assert router.matrix is None


def test_legacy_top_level_groups_with_defaults_and_default_group() -> None:
    config = load(
        MODELS
        + """\
groups:
  pair:
    swap: false
    members: [b, a]
  forever:
    persistent: true
    exclusive: false
    members: [d]
"""
    )
    groups = config.routing.router.groups
    assert groups["pair"] == GroupConfig(
        "pair", swap=False, exclusive=True, persistent=False, members=("b", "a")
    )
    assert groups["forever"] == GroupConfig(
        "forever", swap=True, exclusive=False, persistent=True, members=("d",)
    )
    assert groups[DEFAULT_GROUP_ID].members == ("c",)
    assert config.routing.router.use == "group"


def test_groups_under_routing_router_settings() -> None:
    config = load(
        MODELS
        + """\
routing:
  router:
    settings:
      groups:
        g: {members: [c]}
"""
    )
    assert config.routing.router.groups["g"].members == ("c",)
    assert config.routing.router.groups[DEFAULT_GROUP_ID].members == ("a", "b", "d")


def test_group_member_errors_name_their_lines() -> None:
    errors = errors_of(
        MODELS
        + """\
groups:
  one:
    members: [a, a, missing, alpha]
  two:
    members: [a]
  (default):
    members: [c]
"""
    )
    assert errors == [
        "config.yaml:8: groups.one.members[1]: duplicate model member a found in group: one",
        'config.yaml:8: groups.one.members[2]: unknown model "missing"; members must be model ids from '
        'models:',
        'config.yaml:8: groups.one.members[3]: unknown model "alpha"; it is an alias of a; list the model id',
        "config.yaml:10: groups.two.members[0]: model member a is used in multiple groups: one and two",
        "config.yaml:11: groups.(default): the group id (default) is reserved for models in no group; "
        "rename it",
    ]


def test_group_must_be_a_mapping_and_unknown_group_keys_warn() -> None:
    assert one_error(MODELS + "groups:\n  g: [a]\n") == (
        "config.yaml:7: groups.g: must be a mapping with swap:, exclusive:, persistent:, members:, got a list"
    )
    config = load(MODELS + "groups:\n  g:\n    member: [a]\n")
    assert config.warnings == (
        "config.yaml:8: groups.g.member: unknown key, ignored; did you mean 'members'?",
    )


def test_legacy_keys_and_routing_router_together_must_migrate() -> None:
    error = one_error(
        MODELS
        + """\
groups:
  g: {members: [a]}
routing:
  router:
    use: group
"""
    )
    assert error == (
        "config.yaml:6: groups: config uses both the legacy top-level 'matrix'/'groups' keys and the new "
        "'routing.router' block; please migrate the top-level keys into 'routing.router' and remove them"
    )


def test_legacy_groups_and_matrix_together_are_an_error() -> None:
    error = one_error(
        MODELS
        + """\
groups:
  g: {members: [a]}
matrix:
  sets: {s: "a"}
"""
    )
    assert error == "config.yaml:8: matrix: config cannot use both 'groups' and 'matrix'; keep one of them"


def test_routing_scheduler_alone_does_not_clash_with_legacy_groups() -> None:
    config = load(MODELS + "groups:\n  g: {members: [a]}\nrouting:\n  scheduler:\n    use: fifo\n")
    assert config.routing.router.groups["g"].members == ("a",)


def test_unknown_router_lists_the_valid_ones() -> None:
    assert one_error(MODELS + "routing:\n  router:\n    use: random\n") == (
        'config.yaml:8: routing.router.use: unknown router "random" (valid: group, matrix, vram)'
    )


def test_use_matrix_without_matrix_settings() -> None:
    assert one_error(MODELS + "routing:\n  router:\n    use: matrix\n") == (
        "config.yaml:8: routing.router.use: routing.router.use is 'matrix' but "
        "routing.router.settings.matrix is not set"
    )


def test_matrix_under_routing_compiles_with_vars_costs_and_ref_order() -> None:
    config = load(
        MODELS
        + """\
routing:
  router:
    use: matrix
    settings:
      groups:
        ignored: {members: [a]}
      matrix:
        vars: {x: a, y: b}
        evict_costs: {y: 50, c: 3}
        sets:
          with_ref: "+pair & c"
          pair: "x & y"
          solo: "d"
"""
    )
    router = config.routing.router
    assert router.use == "matrix"
    matrix = router.matrix
    assert matrix is not None
    assert matrix.sets == (("pair", "x & y"), ("with_ref", "+pair & c"), ("solo", "d"))
    assert dict(matrix.evict_costs) == {"b": 50, "c": 3}
    assert dict(matrix.vars) == {"x": "a", "y": "b"}
    assert matrix.program.solve("c", ["a"]).evict == ()
    assert dict(router.groups) == {
        DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=("a", "b", "c", "d"))
    }


def test_legacy_top_level_matrix() -> None:
    config = load(MODELS + "matrix:\n  sets:\n    s: a & b\n")
    assert config.routing.router.use == "matrix"
    assert config.routing.router.matrix is not None
    assert config.routing.router.matrix.sets == (("s", "a & b"),)


@pytest.mark.parametrize(
    ("matrix", "expected"),
    [
        (
            '  sets:\n    good: a\n    bad: "a & (b"\n',
            'config.yaml:9: matrix.sets.bad: set "bad": missing closing parenthesis at column 7',
        ),
        (
            "  vars: {v_1: a}\n  sets: {s: a}\n",
            "config.yaml:7: matrix.vars.v_1: var key \"v_1\" must contain only alphanumeric, '-' or '.' "
            "characters and be 1-32 characters long",
        ),
        (
            "  vars:\n    v: nope\n  sets: {s: a}\n",
            'config.yaml:8: matrix.vars.v: var key "v" references unknown model "nope"',
        ),
        (
            "  evict_costs:\n    a: 0\n  sets: {s: a}\n",
            'config.yaml:8: matrix.evict_costs.a: evict_cost for "a" must be a positive integer, got 0',
        ),
        ("  vars: {}\n", "config.yaml:6: matrix: matrix must define at least one set"),
        (
            '  sets:\n    s: "alpha"\n',
            'config.yaml:8: matrix.sets.s: set "s": unknown var or model "alpha" at column 1',
        ),
        ("  sets:\n    s: [a]\n", "config.yaml:8: matrix.sets.s: must be a single value, got a list"),
    ],
)
def test_matrix_errors_point_at_the_offending_key(matrix: str, expected: str) -> None:
    assert one_error(MODELS + "matrix:\n" + matrix) == expected


def test_vram_router_settings() -> None:
    config = load(
        MODELS
        + """\
routing:
  router:
    use: vram
    settings:
      budget: 22GB
      reserve: 1GiB
      evict_costs:
        alpha: 30
        b: 2.5
"""
    )
    router = config.routing.router
    assert router.use == "vram"
    assert (router.vram.budget, router.vram.reserve) == (22 * 10**9, 1024**3)
    assert dict(router.vram.evict_costs) == {"a": 30, "b": 2.5}
    assert router.groups[DEFAULT_GROUP_ID].members == ("a", "b", "c", "d")


def test_vram_router_defaults_and_errors() -> None:
    vram = load(MODELS + "routing:\n  router:\n    use: vram\n").routing.router.vram
    assert (vram.budget, vram.reserve, dict(vram.evict_costs)) == (None, 512 * 1024**2, {})
    errors = errors_of(
        MODELS
        + """\
routing:
  router:
    use: vram
    settings:
      budget: much
      evict_costs: {nope: 1, a: -1}
"""
    )
    assert errors[0].startswith(
        "config.yaml:10: routing.router.settings.budget: expected a size such as 6.5GB"
    )
    assert errors[1:] == [
        'config.yaml:11: routing.router.settings.evict_costs.nope: unknown model "nope"; '
        "use a model id or alias from models:",
        "config.yaml:11: routing.router.settings.evict_costs.a: must be a positive number, got -1",
    ]


def test_scheduler_defaults() -> None:
    scheduler = load(MODELS).routing.scheduler
    assert scheduler.use == "fifo"
    assert dict(scheduler.priority) == {}
    assert (scheduler.batch.max_wait, scheduler.batch.min_residency) == (30, 10)
    assert scheduler.admission == AdmissionConfig()


def test_fifo_priority_keys_resolve_aliases_to_real_ids() -> None:
    config = load(
        MODELS + "routing:\n  scheduler:\n    settings:\n      fifo:\n        priority: {alpha: 5, b: -1}\n"
    )
    assert dict(config.routing.scheduler.priority) == {"a": 5, "b": -1}


def test_priority_errors() -> None:
    errors = errors_of(
        MODELS
        + """\
routing:
  scheduler:
    settings:
      fifo:
        priority:
          ghost: 1
          a: 2
          alpha: 3
          b: high
"""
    )
    assert errors == [
        'config.yaml:11: routing.scheduler.settings.fifo.priority.ghost: references unknown model "ghost"; '
        "use a model id or alias from models:",
        'config.yaml:13: routing.scheduler.settings.fifo.priority.alpha: names model a again (as "a" '
        'before); '
        "keep one",
        "config.yaml:14: routing.scheduler.settings.fifo.priority.b: must be a whole number (higher goes "
        "first), "
        'got "high"',
    ]


def test_batch_scheduler_and_admission() -> None:
    config = load(
        MODELS
        + """\
routing:
  scheduler:
    use: batch
    settings:
      batch:
        maxWait: 5
        minResidency: 2.5
        priority: {c: 3}
    admission:
      maxQueue: 100
      maxQueuePerModel: 10
      policy: shed-lowest
      queueTimeout: 30
"""
    )
    scheduler = config.routing.scheduler
    assert scheduler.use == "batch"
    assert (scheduler.batch.max_wait, scheduler.batch.min_residency, dict(scheduler.batch.priority)) == (
        5,
        2.5,
        {"c": 3},
    )
    assert scheduler.admission == AdmissionConfig(
        max_queue=100, max_queue_per_model=10, policy="shed-lowest", queue_timeout=30
    )


def test_scheduler_errors() -> None:
    errors = errors_of(
        MODELS
        + """\
routing:
  scheduler:
    use: lifo
    admission:
      maxQueue: -1
      policy: drop-all
"""
    )
    assert errors == [
        'config.yaml:8: routing.scheduler.use: unknown scheduler "lifo" (valid: fifo, batch)',
        "config.yaml:10: routing.scheduler.admission.maxQueue: must be >= 0, got -1",
        'config.yaml:11: routing.scheduler.admission.policy: unknown policy "drop-all" (valid: reject, '
        'shed-lowest)',
    ]


def test_unknown_routing_keys_warn() -> None:
    config = load(MODELS + "routing:\n  routers: {}\n  scheduler:\n    usee: fifo\n")
    assert config.warnings == (
        "config.yaml:7: routing.routers: unknown key, ignored; did you mean 'router'?",
        "config.yaml:9: routing.scheduler.usee: unknown key, ignored; did you mean 'use'?",
    )


def test_prioritizer_on_deadline_and_deadline_defaults() -> None:
    config = load(
        """\
models:
  a: {cmd: "srv --port ${PORT}", deadlineMs: 1500}
  b: {cmd: "srv --port ${PORT}"}
apiKeys:
  - {key: sk-chat, deadlineMs: 800}
  - sk-plain
routing:
  scheduler:
    settings:
      prioritizer: lrs
      onDeadline: reject
"""
    )
    scheduler = config.routing.scheduler
    assert (scheduler.prioritizer, scheduler.on_deadline) == ("lrs", "reject")
    assert config.models["a"].deadline_ms == 1500 and config.models["b"].deadline_ms == 0
    assert [k.deadline_ms for k in config.api_keys] == [800, 0]


def test_prioritizer_defaults_to_fcfs_and_ignore() -> None:
    scheduler = load(MODELS).routing.scheduler
    assert (scheduler.prioritizer, scheduler.on_deadline) == ("fcfs", "ignore")


def test_prioritizer_and_deadline_errors_name_line_key_and_fix() -> None:
    errors = errors_of(
        """\
models:
  a: {cmd: "srv --port ${PORT}", deadlineMs: -5}
apiKeys:
  - {key: sk-chat, deadlineMs: soon}
routing:
  scheduler:
    settings:
      prioritizer: sjf
      onDeadline: drop
"""
    )
    assert errors == [
        "config.yaml:2: models.a.deadlineMs: must be >= 0, got -5; accepted: 0 (no deadline) or milliseconds "
        "after arrival",
        'config.yaml:4: apiKeys[0].deadlineMs: must be milliseconds, got "soon"',
        'config.yaml:8: routing.scheduler.settings.prioritizer: unknown prioritizer "sjf" (valid: fcfs, edf, '
        'lrs)',
        'config.yaml:9: routing.scheduler.settings.onDeadline: unknown onDeadline "drop" (valid: ignore, '
        'reject)',
    ]


def test_watchdog_timeouts_are_read_and_validated() -> None:
    config = load('models:\n  a:\n    cmd: "srv --port ${PORT}"\n    timeouts: {wall: 600, idle: 30}\n')
    timeouts = config.models["a"].timeouts
    assert (timeouts.wall, timeouts.idle) == (600, 30)
    assert load(MODELS).models["a"].timeouts.wall == 0
    assert one_error('models:\n  a:\n    cmd: "srv --port ${PORT}"\n    timeouts: {idle: -1}\n') == (
        "config.yaml:4: models.a.timeouts.idle: must be >= 0, got -1; accepted: 0 (no limit) or seconds"
    )


def test_preempt_below_is_off_unless_set() -> None:
    assert load(MODELS).routing.scheduler.preempt_below is None
    config = load(MODELS + "routing:\n  scheduler:\n    settings:\n      preemptBelow: 0\n")
    assert config.routing.scheduler.preempt_below == 0
    assert one_error(MODELS + "routing:\n  scheduler:\n    settings:\n      preemptBelow: low\n") == (
        "config.yaml:9: routing.scheduler.settings.preemptBelow: must be a whole number (requests below "
        'this priority may be preempted), got "low"'
    )
