"""The config watcher's idea of "changed", and what a reload preloads."""

from __future__ import annotations

import os
from pathlib import Path

from llmswap.server.reload import ConfigWatcher, ReloadOutcome


def bump_mtime(path: Path) -> None:
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


def test_untouched_file_is_not_a_change(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("models: {}\n")
    watcher = ConfigWatcher(path)
    assert not watcher.changed()


def test_touching_or_rewriting_the_same_text_is_not_a_change(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("models: {}\n")
    watcher = ConfigWatcher(path)
    bump_mtime(path)
    assert not watcher.changed()
    path.write_text("models: {}\n")
    bump_mtime(path)
    assert not watcher.changed()


def test_new_content_is_a_change_once(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("models: {}\n")
    watcher = ConfigWatcher(path)
    path.write_text("models: {a: {cmd: x}}\n")
    bump_mtime(path)
    assert watcher.changed()
    assert not watcher.changed()


def test_a_file_briefly_missing_is_not_a_change(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("models: {}\n")
    watcher = ConfigWatcher(path)
    path.unlink()
    assert not watcher.changed()
    path.write_text("models: {}\n")
    assert not watcher.changed()
    path.write_text("logLevel: debug\n")
    bump_mtime(path)
    assert watcher.changed()


def test_reload_preloads_only_models_with_a_new_process() -> None:
    outcome = ReloadOutcome(applied=True, kept=("a",), changed=("b",), added=("c",), removed=("d",))
    assert outcome.to_preload == ("b", "c")
