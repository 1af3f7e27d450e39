"""The prefetch of a model's files: which files a command names, the room rule, and the read itself (a real
file and the real page cache, with the host's memory reading faked only where a test needs a small host)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

from llmswap.process.prefetch import Prefetch, files_named, room_for
from tests.helpers.pagecache import drop, resident_fraction

MIB = 1 << 20


def test_the_files_a_command_names_are_its_existing_regular_file_arguments(tmp_path: Path) -> None:
    model, projector = tmp_path / "m.gguf", tmp_path / "proj.gguf"
    model.write_bytes(b"x")
    projector.write_bytes(b"y")
    argv = ("/usr/bin/true", "-m", str(model), f"--mmproj={projector}", "--port", "8080", str(tmp_path),
            str(tmp_path / "missing.gguf"), "-m", str(model))
    assert files_named(argv) == [model, projector]  # not the program, a folder, a missing file, a repeat


def test_relative_paths_are_read_from_the_working_folder(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"x")
    assert files_named(("server", "-m", "m.gguf"), cwd=tmp_path) == [tmp_path / "m.gguf"]


def test_a_file_fits_in_what_is_available_beyond_a_tenth_of_the_total() -> None:
    assert room_for(500, available=600, total=1000)
    assert not room_for(501, available=600, total=1000)
    assert not room_for(1, available=50, total=1000)


def test_a_read_puts_the_file_in_the_page_cache(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(bytes(range(256)) * (16 * MIB // 256))
    drop(weights)
    assert resident_fraction(weights) < 0.5
    report = Prefetch("m", [weights]).read_all()
    assert report.read == (str(weights),) and report.bytes == 16 * MIB and not report.skipped
    assert resident_fraction(weights) > 0.95


def test_a_file_larger_than_the_room_is_skipped_and_said_so(tmp_path: Path) -> None:
    small, large = tmp_path / "small.bin", tmp_path / "large.bin"
    small.write_bytes(b"s" * MIB)
    large.write_bytes(b"l" * 4 * MIB)
    drop(large)
    report = Prefetch("m", [large, small], memory=lambda: (4 * MIB, 10 * MIB)).read_all()
    assert report.read == (str(small),)
    assert len(report.skipped) == 1 and report.skipped[0].startswith(f"{large}: 4 MiB would not fit")
    assert resident_fraction(large) < 0.5


def test_a_cancelled_prefetch_stops_before_the_next_file(tmp_path: Path) -> None:
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(b"a" * MIB)
    second.write_bytes(b"b" * MIB)
    drop(second)
    at_second = threading.Event()
    go_on = threading.Event()
    files_seen = []

    def memory() -> tuple[int, int]:
        files_seen.append(True)
        if len(files_seen) == 2:  # the second file: hold the reader here until the test has cancelled
            at_second.set()
            go_on.wait(5)
        return 1 << 40, 1 << 40

    job = Prefetch("m", [first, second], memory=memory)

    async def run() -> None:
        task = asyncio.create_task(job.run())
        await asyncio.to_thread(at_second.wait, 5)  # the first file is read, the second not begun
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # the awaiter is gone at once; the reader still waits in `memory`
        go_on.set()

    asyncio.run(run())  # returns once the worker thread has finished
    assert resident_fraction(first) > 0.95
    assert resident_fraction(second) < 0.5  # cancelled before its first chunk was read
