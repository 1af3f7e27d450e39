"""The config watcher's idea of "changed", and what a reload preloads."""

from __future__ import annotations

import os
from pathlib import Path

from llmswap.config import ConfigSources
from llmswap.server.reload import ConfigWatcher, ReloadOutcome, describe_outcome


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


def directory_watcher(tmp_path: Path) -> tuple[ConfigWatcher, Path]:
    main = tmp_path / "config.yaml"
    main.write_text("models: {}\n")
    directory = tmp_path / "conf.d"
    directory.mkdir()
    (directory / "a.yaml").write_text("apiKeys: [a]\n")
    return ConfigWatcher(ConfigSources(main, directory)), directory


def test_a_file_added_to_the_config_directory_is_a_change(tmp_path: Path) -> None:
    watcher, directory = directory_watcher(tmp_path)
    (directory / "b.yml").write_text("apiKeys: [b]\n")
    assert watcher.changed()
    assert not watcher.changed()


def test_a_file_changed_in_the_config_directory_is_a_change(tmp_path: Path) -> None:
    watcher, directory = directory_watcher(tmp_path)
    (directory / "a.yaml").write_text("apiKeys: [changed]\n")
    bump_mtime(directory / "a.yaml")
    assert watcher.changed()


def test_a_file_removed_from_the_config_directory_is_a_change(tmp_path: Path) -> None:
    watcher, directory = directory_watcher(tmp_path)
    (directory / "a.yaml").unlink()
    assert watcher.changed()
    assert not watcher.changed()


def test_other_files_and_touches_in_the_config_directory_are_no_change(tmp_path: Path) -> None:
    watcher, directory = directory_watcher(tmp_path)
    (directory / "notes.txt").write_text("not config\n")
    (directory / "sub").mkdir()
    (directory / "sub" / "c.yaml").write_text("apiKeys: [c]\n")
    bump_mtime(directory / "a.yaml")
    assert not watcher.changed()


def test_a_config_directory_briefly_missing_is_not_a_change(tmp_path: Path) -> None:
    watcher, directory = directory_watcher(tmp_path)
    moved = directory.rename(tmp_path / "elsewhere")
    assert not watcher.changed()
    moved.rename(directory)
    assert not watcher.changed()


def test_a_reload_says_what_it_did_to_each_model_in_one_line() -> None:
    outcome = ReloadOutcome(applied=True, kept=("large", "small"), running=("small",), changed=("medium",),
                            added=("new",), removed=("old",))
    assert describe_outcome(outcome) == (
        "kept running: small; kept, not running: large; changed, stopped (they start again on demand): "
        "medium; removed, stopped: old; added: new")
    assert describe_outcome(ReloadOutcome(applied=True, kept=("a",))) == "kept, not running: a"
    assert describe_outcome(ReloadOutcome(applied=True)) == "no model is configured"
