"""The slot saves on disk, with no process and no event loop: staleness, partial saves, the size bound."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from llmswap.kvcache.disk import SaveFolder, all_saves, fingerprint, hold_bound


def write_save(folder: SaveFolder, slot: int, size: int, *, used: float | None = None,
               tokens: int = 10) -> Path:
    """A save as llama-server leaves it (written under the partial name), then kept by `saved`."""
    (folder.path / f"slot{slot}.bin.partial").write_bytes(b"k" * size)
    save = folder.saved(slot, tokens, 0.01)
    assert save is not None
    if used is not None:
        os.utime(save.path, (used, used))
    return save.path


def test_a_new_folder_is_private_and_has_nothing_to_restore(tmp_path: Path) -> None:
    folder = SaveFolder(tmp_path / "kv" / "chat")
    assert folder.prepare("fp") == []
    assert stat.S_IMODE(folder.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.path.parent.stat().st_mode) == 0o700


def test_saves_of_a_clean_stop_with_the_same_fingerprint_are_restored(tmp_path: Path) -> None:
    folder = SaveFolder(tmp_path / "chat")
    folder.prepare("fp")
    folder.serving()
    write_save(folder, 0, 100, tokens=3223)
    write_save(folder, 1, 50, tokens=7)
    folder.finished("fp")

    assert folder.prepare("fp") == [0, 1]
    assert [(save.slot, save.tokens, save.bytes) for save in folder.saves()] == [(0, 3223, 100), (1, 7, 50)]


def test_a_changed_fingerprint_deletes_the_saves(tmp_path: Path) -> None:
    folder = SaveFolder(tmp_path / "chat")
    folder.prepare("fp")
    write_save(folder, 0, 100)
    folder.finished("fp")

    assert folder.prepare("another model file") == []
    assert not (folder.path / "slot0.bin").exists()


def test_a_server_that_served_and_was_not_saved_leaves_stale_saves(tmp_path: Path) -> None:
    # It restored, served (the folder is unclean from then on) and died, or llmswap was killed.
    folder = SaveFolder(tmp_path / "chat")
    folder.prepare("fp")
    write_save(folder, 0, 100)
    folder.finished("fp")
    assert folder.prepare("fp") == [0]
    folder.serving()

    assert folder.prepare("fp") == []
    assert folder.saves() == []


def test_a_save_cut_short_is_never_restored(tmp_path: Path) -> None:
    folder = SaveFolder(tmp_path / "chat")
    folder.prepare("fp")
    write_save(folder, 0, 100)
    (folder.path / "slot1.bin.partial").write_bytes(b"half")  # llmswap was killed while slot 1 was written
    folder.finished("fp")

    assert folder.prepare("fp") == [0]
    assert not (folder.path / "slot1.bin.partial").exists()


def test_a_state_file_that_cannot_be_read_makes_the_saves_stale(tmp_path: Path) -> None:
    folder = SaveFolder(tmp_path / "chat")
    folder.prepare("fp")
    write_save(folder, 0, 100)
    folder.finished("fp")
    (folder.path / "state.json").write_text("{not json")

    assert folder.prepare("fp") == []


def test_the_state_file_records_tokens_and_cleanliness(tmp_path: Path) -> None:
    folder = SaveFolder(tmp_path / "chat")
    folder.prepare("fp")
    folder.serving()
    write_save(folder, 0, 100, tokens=42)
    state = json.loads((folder.path / "state.json").read_text())
    assert state["clean"] is False and state["slots"]["0"]["tokens"] == 42
    folder.finished("fp")
    assert json.loads((folder.path / "state.json").read_text())["clean"] is True


def test_fingerprint_follows_the_command_and_the_files_it_names(tmp_path: Path) -> None:
    model = tmp_path / "chat.gguf"
    model.write_bytes(b"weights")
    argv = ("llama-server", "-m", str(model), "--port", "5800")
    first = fingerprint("llama-server -m chat.gguf", argv)
    assert fingerprint("llama-server -m chat.gguf", argv) == first
    assert fingerprint("llama-server -m chat.gguf -c 4096", argv) != first  # the command changed

    model.write_bytes(b"other weights")  # another size
    assert fingerprint("llama-server -m chat.gguf", argv) != first

    second = fingerprint("x", ("llama-server", f"--model={model}"))
    os.utime(model, ns=(1, 1))  # same size, another mtime
    assert fingerprint("x", ("llama-server", f"--model={model}")) != second


def test_fingerprint_reads_relative_paths_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"a")
    before = fingerprint("c", ("-m", "m.gguf"), cwd=tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"ab")
    assert fingerprint("c", ("-m", "m.gguf"), cwd=tmp_path) != before


def test_the_bound_deletes_the_least_recently_used_saves_first(tmp_path: Path) -> None:
    chat, code = SaveFolder(tmp_path / "chat"), SaveFolder(tmp_path / "code")
    chat.prepare("a")
    code.prepare("b")
    oldest = write_save(chat, 0, 400, used=1_000)
    middle = write_save(code, 0, 400, used=2_000)
    newest = write_save(chat, 1, 400, used=3_000)

    deleted = hold_bound(tmp_path, 900)

    assert [save.path for save in deleted] == [oldest]
    assert not oldest.exists() and middle.exists() and newest.exists()
    assert sum(save.bytes for save in all_saves(tmp_path)) <= 900


def test_the_bound_never_deletes_a_save_being_restored(tmp_path: Path) -> None:
    chat, code = SaveFolder(tmp_path / "chat"), SaveFolder(tmp_path / "code")
    chat.prepare("a")
    code.prepare("b")
    restoring = write_save(chat, 0, 400, used=1_000)
    other = write_save(code, 0, 400, used=2_000)
    hold_bound(tmp_path, 500, {restoring})
    assert restoring.exists() and not other.exists()


def test_a_save_larger_than_the_bound_is_kept_while_a_restore_reads_it(tmp_path: Path) -> None:
    chat = SaveFolder(tmp_path / "chat")
    chat.prepare("a")
    huge = write_save(chat, 0, 1_000, used=5_000)
    assert hold_bound(tmp_path, 500, {huge}) == [] and huge.exists()
    assert [save.path for save in hold_bound(tmp_path, 500)] == [huge]  # once read, it goes


def test_clear_keeps_a_save_being_restored(tmp_path: Path) -> None:
    chat = SaveFolder(tmp_path / "chat")
    chat.prepare("a")
    reading = write_save(chat, 0, 400, used=1_000)
    idle = write_save(chat, 1, 400, used=2_000)
    assert [save.path for save in chat.clear({reading})] == [idle]
    assert reading.exists() and not idle.exists()


def test_a_save_larger_than_the_bound_is_not_kept(tmp_path: Path) -> None:
    chat = SaveFolder(tmp_path / "chat")
    chat.prepare("a")
    small = write_save(chat, 0, 10, used=1_000)
    huge = write_save(chat, 1, 1_000, used=5_000)

    hold_bound(tmp_path, 500)

    assert small.exists() and not huge.exists()


def test_touch_makes_a_restored_save_the_most_recent(tmp_path: Path) -> None:
    chat = SaveFolder(tmp_path / "chat")
    chat.prepare("a")
    first = write_save(chat, 0, 400, used=1_000)
    second = write_save(chat, 1, 400, used=2_000)
    chat.touch(0)  # restored just now

    hold_bound(tmp_path, 500)

    assert first.exists() and not second.exists()


def test_clear_deletes_every_save_and_says_how_much(tmp_path: Path) -> None:
    chat = SaveFolder(tmp_path / "chat")
    chat.prepare("a")
    write_save(chat, 0, 30)
    write_save(chat, 1, 12)
    assert sum(save.bytes for save in chat.clear()) == 42
    assert chat.saves() == []


def test_the_keepers_fingerprint_leaves_the_port_out(tmp_path: Path) -> None:
    from llmswap.config.model import KvCacheSettings, ModelConfig
    from llmswap.kvcache.keeper import KvKeeper, KvShared

    def keeper(port: int) -> KvKeeper:
        cmd = ("llama-server", "--port", str(port), "--slot-save-path", str(tmp_path / "kv" / "m"))
        config = ModelConfig(id="m", cmd=cmd, cmd_text=" ".join(cmd), port=port, kv_dir=tmp_path / "kv" / "m",
                             kv_cache=KvCacheSettings(dir=tmp_path / "kv"))
        made = KvKeeper(config, KvShared())
        made.prepare()
        return made

    first = keeper(5800)
    SaveFolder(first.folder.path).finished(first.written_by)
    assert keeper(5801).written_by == first.written_by  # another model added before it: same saves
