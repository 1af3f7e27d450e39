"""`routing:` (and the legacy top-level `groups:` / `matrix:`): router, its settings, the scheduler.

A file uses either the legacy top-level keys or `routing.router`, never both (llama-swap's migration
rule). Under `routing.router.settings` both groups and a matrix may be written; `use` picks one.
Group members and priority keys are checked against the models here, at load, with their lines,
rather than failing later when the router is built.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.model import (
    DEFAULT_GROUP_ID,
    ON_DEADLINE,
    PRIORITIZERS,
    AdmissionConfig,
    BatchSettings,
    GroupConfig,
    MatrixConfig,
    RouterConfig,
    RoutingConfig,
    SchedulerConfig,
    VramSettings,
)
from llmswap.config.yamltree import Map, Scalar, describe

Resolve = Callable[[str], str | None]

ROUTERS = ("group", "matrix", "vram")
SCHEDULERS = ("fifo", "batch")
ADMISSION_POLICIES = ("reject", "shed-lowest")
VRAM_KEYS = ("budget", "reserve", "evict_costs")
GROUP_KEYS = keys.GROUP  # the keys the loader accepts here (llmswap.config.keys)
MIGRATION_MESSAGE = (
    "config uses both the legacy top-level 'matrix'/'groups' keys and the new 'routing.router' block; "
    "please migrate the top-level keys into 'routing.router' and remove them"
)


def read_routing(root: Fields, model_ids: Collection[str], aliases: Mapping[str, str]) -> RoutingConfig:
    def resolve(name: str) -> str | None:
        return name if name in model_ids else aliases.get(name)

    routing = root.mapping("routing", "a mapping with router: and scheduler:")
    routing.warn_unknown(keys.ROUTING)
    return RoutingConfig(
        router=_read_router(root, routing, model_ids, aliases, resolve),
        scheduler=_read_scheduler(
            routing.mapping("scheduler", "a mapping with use:, settings:, admission:"), resolve
        ),
    )


def _read_router(
    root: Fields, routing: Fields, model_ids: Collection[str], aliases: Mapping[str, str], resolve: Resolve
) -> RouterConfig:
    router = routing.mapping("router", "a mapping with use: and settings:")
    router.warn_unknown(keys.ROUTER)
    settings = router.mapping("settings", "a mapping of router settings")
    settings.warn_unknown(keys.ROUTER_SETTINGS)
    use = router.text("use").strip()

    legacy_groups = root.node("groups")
    legacy_matrix = root.node("matrix")
    if isinstance(legacy_groups, Map) and not legacy_groups.entries:
        legacy_groups = None  # `groups: {}` configures nothing, as in llama-swap
    has_legacy = legacy_matrix is not None or legacy_groups is not None
    settings_groups = settings.node("groups")
    has_routing = (
        bool(use)
        or settings.has("matrix")
        or (isinstance(settings_groups, Map) and bool(settings_groups.entries))
        or any(settings.has(key) for key in VRAM_KEYS)
    )

    if has_legacy and has_routing:
        key = "groups" if legacy_groups is not None else "matrix"
        root.error(key, MIGRATION_MESSAGE)
        has_legacy = False  # carry on with routing.router so its own mistakes are reported too

    if has_legacy:
        groups_fields = root.mapping("groups", "a mapping of group ids to groups")
        if legacy_groups is not None and legacy_matrix is not None:
            root.error("matrix", "config cannot use both 'groups' and 'matrix'; keep one of them")
            legacy_matrix = None
        use = "matrix" if legacy_matrix is not None else "group"
        matrix_fields = root.mapping("matrix", "a mapping with vars:, sets:, evict_costs:")
        matrix_node = legacy_matrix
    else:
        groups_fields = settings.mapping("groups", "a mapping of group ids to groups")
        matrix_fields = settings.mapping("matrix", "a mapping with vars:, sets:, evict_costs:")
        matrix_node = settings.node("matrix")
        use = use or "group"
        if use not in ROUTERS:
            router.error("use", f'unknown router "{use}" (valid: {", ".join(ROUTERS)})')
            use = "group"
        if use == "matrix" and not settings.has("matrix"):
            router.error(
                "use", "routing.router.use is 'matrix' but routing.router.settings.matrix is not set"
            )
            use = "group"

    if use == "group":
        groups = _read_groups(groups_fields, model_ids, aliases)
    else:
        groups = {DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID, members=tuple(sorted(model_ids)))}
    matrix = None
    if use == "matrix" and isinstance(matrix_node, Map):  # anything else was reported as the wrong type
        matrix = _read_matrix(matrix_fields, model_ids)

    # Like groups and matrix, vram settings may sit idle beside the router `use` picks.
    vram = _read_vram(settings, resolve) if use == "vram" else VramSettings()
    return RouterConfig(use=use, groups=MappingProxyType(groups), matrix=matrix, vram=vram)


def _read_groups(
    fields: Fields, model_ids: Collection[str], aliases: Mapping[str, str]
) -> dict[str, GroupConfig]:
    groups: dict[str, GroupConfig] = {}
    member_of: dict[str, str] = {}
    for group_id in fields.names():
        group = fields.mapping(group_id, "a mapping with swap:, exclusive:, persistent:, members:")
        if not isinstance(fields.map.get(group_id), Map):
            continue
        group.warn_unknown(keys.GROUP)
        if group_id == DEFAULT_GROUP_ID:
            fields.error(
                group_id, f"the group id {DEFAULT_GROUP_ID} is reserved for models in no group; rename it"
            )
            continue
        members: list[str] = []
        for member, line, where in group.texts("members", "a list of model ids"):
            if member in members:
                fields.problems.error(
                    line, where, f"duplicate model member {member} found in group: {group_id}"
                )
                continue
            if member not in model_ids:
                hint = (
                    f"it is an alias of {aliases[member]}; list the model id"
                    if member in aliases
                    else "members must be model ids from models:"
                )
                fields.problems.error(line, where, f'unknown model "{member}"; {hint}')
                continue
            if member in member_of:
                fields.problems.error(
                    line,
                    where,
                    f"model member {member} is used in multiple groups: {member_of[member]} and {group_id}",
                )
                continue
            member_of[member] = group_id
            members.append(member)
        groups[group_id] = GroupConfig(
            id=group_id,
            swap=group.flag("swap", True),
            exclusive=group.flag("exclusive", True),
            persistent=group.flag("persistent", False),
            members=tuple(members),
        )
    ungrouped = tuple(sorted(model for model in model_ids if model not in member_of))
    groups[DEFAULT_GROUP_ID] = GroupConfig(DEFAULT_GROUP_ID, members=ungrouped)
    return groups


def _scalar_entries(fields: Fields, key: str, what: str) -> tuple[list[tuple[str, Scalar]], bool]:
    """(name, value) pairs of a mapping of scalars, and whether every value was a scalar."""
    section = fields.mapping(key, what)
    pairs: list[tuple[str, Scalar]] = []
    ok = True
    for name, entry in section.map.entries.items():
        if not isinstance(entry.node, Scalar) or entry.node.value is None:
            section.error(name, f"must be a single value, got {describe(entry.node)}")
            ok = False
            continue
        pairs.append((name, entry.node))
    return pairs, ok


def _read_matrix(fields: Fields, model_ids: Collection[str]) -> MatrixConfig | None:
    from llmswap.config.matrix_dsl import MatrixError, compile_matrix

    fields.warn_unknown(keys.MATRIX)
    variables, vars_ok = _scalar_entries(fields, "vars", "a mapping of short names to model ids")
    sets, sets_ok = _scalar_entries(fields, "sets", "a mapping of set names to expressions")
    costs, costs_ok = _scalar_entries(fields, "evict_costs", "a mapping of model ids or vars to costs")
    if not (vars_ok and sets_ok and costs_ok):
        return None
    try:
        program = compile_matrix(
            {name: value.text for name, value in variables},
            [(name, value.text) for name, value in sets],
            {name: value.value for name, value in costs},
            model_ids,
        )
    except MatrixError as exc:
        section, line = fields, fields.line()
        if exc.path:
            sub = fields.map.get(exc.path[0])
            if isinstance(sub, Map) and len(exc.path) > 1 and exc.path[1] in sub.entries:
                line = sub.entries[exc.path[1]].key_line
            elif exc.path[0] in fields.map.entries:
                line = fields.line(exc.path[0])
        where = ".".join((section.path, *exc.path))
        fields.problems.error(line, where, exc.message)
        return None
    return MatrixConfig(
        vars=program.vars, evict_costs=program.evict_costs, sets=program.sets, program=program
    )


def _read_vram(settings: Fields, resolve: Resolve) -> VramSettings:
    defaults = VramSettings()
    costs: dict[str, float] = {}
    evict = settings.mapping("evict_costs", "a mapping of model ids to costs")
    for name in evict.names():
        node = evict.node(name)
        cost = node.value if isinstance(node, Scalar) else None
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 < cost < float("inf"):
            evict.error(name, f"must be a positive number, got {describe(node)}")
            continue
        model = resolve(name)
        if model is None:
            evict.error(name, f'unknown model "{name}"; use a model id or alias from models:')
            continue
        costs[model] = cost
    return VramSettings(
        budget=settings.size("budget", None),
        reserve=settings.size("reserve", defaults.reserve) or 0,
        evict_costs=MappingProxyType(costs),
    )


def _read_priority(fields: Fields, resolve: Resolve) -> Mapping[str, int]:
    priority: dict[str, int] = {}
    named_by: dict[str, str] = {}
    for name in fields.names():
        value = fields.integer(name, 0, what="a whole number (higher goes first)")
        if not fields.has(name):
            continue
        model = resolve(name)
        if model is None:
            fields.error(name, f'references unknown model "{name}"; use a model id or alias from models:')
            continue
        if model in named_by:
            fields.error(name, f'names model {model} again (as "{named_by[model]}" before); keep one')
            continue
        named_by[model] = name
        priority[model] = value
    return MappingProxyType(priority)


def _read_scheduler(fields: Fields, resolve: Resolve) -> SchedulerConfig:
    fields.warn_unknown(keys.SCHEDULER)
    use = fields.text("use").strip() or "fifo"
    if use not in SCHEDULERS:
        fields.error("use", f'unknown scheduler "{use}" (valid: {", ".join(SCHEDULERS)})')
        use = "fifo"
    settings = fields.mapping("settings", "a mapping with fifo:, batch:, prioritizer:, onDeadline:")
    settings.warn_unknown(keys.SCHEDULER_SETTINGS)
    prioritizer = settings.text("prioritizer", "fcfs").strip() or "fcfs"
    if prioritizer not in PRIORITIZERS:
        valid = ", ".join(PRIORITIZERS)
        settings.error("prioritizer", f'unknown prioritizer "{prioritizer}" (valid: {valid})')
        prioritizer = "fcfs"
    on_deadline = settings.text("onDeadline", "ignore").strip() or "ignore"
    if on_deadline not in ON_DEADLINE:
        settings.error("onDeadline", f'unknown onDeadline "{on_deadline}" (valid: {", ".join(ON_DEADLINE)})')
        on_deadline = "ignore"
    fifo = settings.mapping("fifo", "a mapping with priority:")
    fifo.warn_unknown(keys.FIFO)
    batch = settings.mapping("batch", "a mapping with maxWait:, minResidency:, priority:")
    batch.warn_unknown(keys.BATCH)
    batch_defaults = BatchSettings()
    return SchedulerConfig(
        use=use,
        priority=_read_priority(fifo.mapping("priority", "a mapping of model names to priorities"), resolve),
        batch=BatchSettings(
            max_wait=batch.number("maxWait", batch_defaults.max_wait, minimum=0),
            min_residency=batch.number("minResidency", batch_defaults.min_residency, minimum=0),
            priority=_read_priority(
                batch.mapping("priority", "a mapping of model names to priorities"), resolve
            ),
        ),
        admission=_read_admission(fields.mapping("admission", "a mapping of queue bounds")),
        prioritizer=prioritizer,
        on_deadline=on_deadline,
        preempt_below=settings.integer(
            "preemptBelow", 0, what="a whole number (requests below this priority may be preempted)"
        ) if settings.has("preemptBelow") else None,
    )


def _read_admission(fields: Fields) -> AdmissionConfig:
    fields.warn_unknown(keys.ADMISSION)
    policy = fields.text("policy", "reject").strip() or "reject"
    if policy not in ADMISSION_POLICIES:
        fields.error("policy", f'unknown policy "{policy}" (valid: {", ".join(ADMISSION_POLICIES)})')
        policy = "reject"
    return AdmissionConfig(
        max_queue=fields.integer("maxQueue", 0, minimum=0),
        max_queue_per_model=fields.integer("maxQueuePerModel", 0, minimum=0),
        policy=policy,
        queue_timeout=fields.number(
            "queueTimeout", 0.0, minimum=0, accepted="0 (wait as long as it takes) or seconds"
        ),
    )
