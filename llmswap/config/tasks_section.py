"""`tasks:`: the durable background task queue (the Peregrine adapter).

Relative paths are taken from the config file's directory, not the working directory, so the same
file finds the same database however llmswap is started. A `postgresql://` URL is a queue several hosts
share (llmswap.tasks.queue.shared); its driver is an extra, checked here so the error names the key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.model import TasksConfig, TaskTypeConfig
from llmswap.config.yamltree import Map

DEFAULT_TASKS_DB = "./llmswap-tasks.sqlite"
TASKS_KEYS = keys.TASKS  # the keys the loader accepts here (llmswap.config.keys)
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
TASK_TYPE_KEYS = keys.TASK_TYPE  # the keys the loader accepts here (llmswap.config.keys)


def resolve_path(text: str, base_dir: Path) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else base_dir / path


def read_tasks(root: Fields, base_dir: Path, resolve: Callable[[str], str | None]) -> TasksConfig | None:
    if "tasks" not in root.map.entries:
        return None
    fields = root.mapping("tasks", "a mapping with db:, maxQueueDepth:, types:, priority:, maxPreemptions:, "
                                   "host:, leaseSeconds:")
    fields.warn_unknown(keys.TASKS)
    defaults = TasksConfig(db=Path(DEFAULT_TASKS_DB))
    db = fields.text("db", DEFAULT_TASKS_DB).strip() or DEFAULT_TASKS_DB
    types: dict[str, TaskTypeConfig] = {}
    section = fields.mapping("types", "a mapping of task type names to {model, vram}")
    for name in section.names():
        task_type = section.mapping(name, "a mapping with model: and vram:")
        if not isinstance(section.map.get(name), Map):
            continue
        task_type.warn_unknown(keys.TASK_TYPE)
        requested = task_type.text("model").strip()
        if not requested:
            task_type.error(
                "model" if "model" in task_type.map.entries else None,
                "model is required: the model id or alias that runs this task type",
            )
            continue
        model = resolve(requested)
        if model is None:
            task_type.error("model", f'unknown model "{requested}"; use a model id or alias from models:')
            continue
        if "vram" in task_type.map.entries:
            task_type.warn("vram", f"not used: the router budgets the memory of the model itself (its "
                                   f"footprint); declare it as models.{model}.vram instead")
        types[name] = TaskTypeConfig(name=name, model=model, vram=task_type.size("vram", None))
    shared = db.startswith(POSTGRES_SCHEMES)
    if shared:
        missing = postgres_missing()
        if missing:
            fields.error("db", missing)
    host = fields.text("host").strip() or None
    if host is not None and not shared:
        fields.warn("host", "not used: a host name matters only in a queue several hosts share "
                            "(tasks.db: postgresql://...)")
    return TasksConfig(
        db=db if shared else resolve_path(db, base_dir),
        max_queue_depth=fields.integer("maxQueueDepth", defaults.max_queue_depth, minimum=1),
        types=MappingProxyType(types),
        priority=fields.integer("priority", defaults.priority),
        max_preemptions=fields.integer("maxPreemptions", defaults.max_preemptions, minimum=0),
        host=host,
        lease_seconds=fields.number("leaseSeconds", defaults.lease_seconds, minimum=1),
    )


def postgres_missing() -> str | None:
    """Why a PostgreSQL URL cannot be used here (its driver is not installed), or None."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return (f"a PostgreSQL URL needs the psycopg driver, and {exc.name} is not installed: "
                "pip install 'llmswap-proxy[postgres]'")
    return None
