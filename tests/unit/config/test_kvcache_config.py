"""`kvCache:`, a model's `kvCache: true` and the `${KV_DIR}` macro."""

from __future__ import annotations

from pathlib import Path

from llmswap.config.kvcache_section import model_kv_dir, save_path_of

from .support import load, one_error

BASE = Path("config.yaml").absolute().parent


def test_kv_dir_is_the_models_folder_under_the_default_state_dir() -> None:
    config = load("""
        models:
          chat:
            cmd: llama-server --port ${PORT} -m chat.gguf --slot-save-path ${KV_DIR}
            kvCache: true
    """)
    chat = config.models["chat"]
    folder = BASE / ".llmswap-state" / "kv" / "chat"
    assert chat.kv_dir == folder
    assert chat.cmd[-1] == str(folder)
    assert chat.kv_cache is not None and chat.kv_cache == config.kv_cache
    assert config.kv_cache is not None and config.kv_cache.max_size == 20 * 1024**3


def test_the_kv_cache_section_sets_dir_size_and_timeouts() -> None:
    config = load("""
        kvCache:
          dir: /var/cache/kv
          maxSize: 512MiB
          saveTimeout: 5
          restoreTimeout: 2.5
        models:
          chat:
            cmd: llama-server --port ${PORT} --slot-save-path ${KV_DIR}
            kvCache: true
    """)
    assert config.kv_cache is not None
    assert (config.kv_cache.dir, config.kv_cache.max_size) == (Path("/var/cache/kv"), 512 * 1024**2)
    assert (config.kv_cache.save_timeout, config.kv_cache.restore_timeout) == (5.0, 2.5)
    assert config.models["chat"].kv_dir == Path("/var/cache/kv/chat")


def test_kv_cache_without_a_slot_save_path_names_the_fix() -> None:
    error = one_error("""
        models:
          chat:
            cmd: llama-server --port ${PORT} -m chat.gguf
            kvCache: true
    """)
    assert error.startswith("config.yaml:5: models.chat.kvCache: cmd does not pass --slot-save-path")
    assert "add `--slot-save-path ${KV_DIR}` to cmd" in error


def test_kv_cache_with_another_folder_names_the_fix() -> None:
    error = one_error("""
        models:
          chat:
            cmd: llama-server --port ${PORT} --slot-save-path=/tmp/elsewhere
            kvCache: true
    """)
    assert "models.chat.kvCache: cmd passes --slot-save-path /tmp/elsewhere" in error
    assert "use `--slot-save-path ${KV_DIR}`" in error


def test_kv_dir_without_kv_cache_is_still_a_folder_but_nothing_is_saved() -> None:
    config = load("""
        models:
          chat:
            cmd: llama-server --port ${PORT} --slot-save-path ${KV_DIR}
    """)
    assert config.models["chat"].kv_dir is not None
    assert config.models["chat"].kv_cache is None


def test_a_bad_max_size_is_an_error() -> None:
    error = one_error("""
        kvCache:
          maxSize: 0
        models: {}
    """)
    assert error.startswith("config.yaml:3: kvCache.maxSize: must be a size above zero")


def test_model_ids_that_are_not_file_names_get_distinct_folders() -> None:
    root = Path("/kv")
    assert model_kv_dir(root, "chat") == Path("/kv/chat")
    first, second = model_kv_dir(root, "org/model"), model_kv_dir(root, "org_model")
    assert first != second and first.parent == root and "/" not in first.name
    assert model_kv_dir(root, "..").name != ".."


def test_save_path_of_reads_both_spellings_and_the_last_wins() -> None:
    assert save_path_of(("llama-server", "--slot-save-path", "/a")) == "/a"
    assert save_path_of(("llama-server", "--slot-save-path=/b", "--slot-save-path", "/c")) == "/c"
    assert save_path_of(("llama-server",)) is None
