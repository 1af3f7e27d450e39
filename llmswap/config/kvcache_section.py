"""`kvCache:` and each model's `kvCache: true`: llama-server slot saves kept across swaps (llmswap.kvcache).

The top-level section is optional; its defaults hold without it. `${KV_DIR}` is a model's own folder under
`kvCache.dir`, named after the model id (characters a file name cannot hold are replaced and a short hash
of the id is added, so two ids never share a folder). A model with `kvCache: true` must pass exactly that
folder to llama-server as `--slot-save-path`: llmswap checks staleness and bounds the disk there.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.model import DEFAULT_KV_MAX_SIZE, KvCacheSettings
from llmswap.config.settings_section import read_choice
from llmswap.config.tasks_section import resolve_path

KV_CACHE_KEYS = keys.KV_CACHE  # the keys the loader accepts here (llmswap.config.keys)
SAVE_MODES = ("auto", "always")
SAVE_PATH_FLAG = "--slot-save-path"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def read_kv_cache(root: Fields, state_dir: Path, base_dir: Path) -> KvCacheSettings:
    """The `kvCache:` section, or its defaults (`<stateDir>/kv`, 20GiB) when it is not written."""
    defaults = KvCacheSettings(dir=state_dir / "kv")
    if "kvCache" not in root.map.entries:
        return defaults
    fields = root.mapping("kvCache", "a mapping with dir:, maxSize:, saveTimeout:, restoreTimeout:, save:")
    fields.warn_unknown(keys.KV_CACHE)
    folder = fields.text("dir").strip()
    max_size = fields.size("maxSize", DEFAULT_KV_MAX_SIZE) or 0
    if max_size <= 0:
        fields.error("maxSize", "must be a size above zero, such as 20GiB; remove kvCache from the models "
                                "that should not save their slots instead")
        max_size = DEFAULT_KV_MAX_SIZE
    return KvCacheSettings(
        dir=resolve_path(folder, base_dir) if folder else defaults.dir,
        max_size=max_size,
        save_timeout=fields.number("saveTimeout", defaults.save_timeout, minimum=0.1),
        restore_timeout=fields.number("restoreTimeout", defaults.restore_timeout, minimum=0.1),
        save=read_choice(fields, "save", SAVE_MODES, "auto"),
    )


def model_kv_dir(root: Path, model_id: str) -> Path:
    """The folder `${KV_DIR}` names for `model_id`."""
    name = _UNSAFE.sub("_", model_id).strip(".") or "model"
    if name != model_id:
        name += "-" + hashlib.sha256(model_id.encode()).hexdigest()[:8]
    return root / name


def save_path_of(argv: tuple[str, ...]) -> str | None:
    """The value `argv` passes as `--slot-save-path` (the last one wins, as in llama-server), or None."""
    found: str | None = None
    for index, part in enumerate(argv):
        if part == SAVE_PATH_FLAG and index + 1 < len(argv):
            found = argv[index + 1]
        elif part.startswith(SAVE_PATH_FLAG + "="):
            found = part.partition("=")[2]
    return found


def check_kv_model(fields: Fields, argv: tuple[str, ...], kv_dir: Path) -> bool:
    """Whether a `kvCache: true` model passes its own `${KV_DIR}` as `--slot-save-path`; reports it if not."""
    given = save_path_of(argv)
    if given is None:
        fields.error("kvCache", f"cmd does not pass {SAVE_PATH_FLAG}: llama-server saves no slots "
                                f"without it; add `{SAVE_PATH_FLAG} ${{KV_DIR}}` to cmd, or remove kvCache")
        return False
    if Path(given).expanduser().resolve() != kv_dir.resolve():
        fields.error("kvCache", f"cmd passes {SAVE_PATH_FLAG} {given}, not the model's own folder: use "
                                f"`{SAVE_PATH_FLAG} ${{KV_DIR}}` (llmswap checks and bounds the saves there)")
        return False
    return True
