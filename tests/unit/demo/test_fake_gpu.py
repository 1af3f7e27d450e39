import os
from pathlib import Path

from llmswap.demo.fake_gpu import live_claims, out_of_memory, pid_alive, remove_claim, write_claim


def _dead_pid() -> int:
    # Above pid_max no process can exist.
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def test_pid_alive_tells_live_from_dead() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(_dead_pid())


def test_write_claim_leaves_only_the_whole_number_under_the_pid(tmp_path: Path) -> None:
    path = write_claim(tmp_path, 1234, 2_000_000_000)
    assert path == tmp_path / "1234"
    assert path.read_text().strip() == "2000000000"
    assert [entry.name for entry in tmp_path.iterdir()] == ["1234"]


def test_remove_claim_tolerates_a_missing_file(tmp_path: Path) -> None:
    path = write_claim(tmp_path, 1234, 1)
    remove_claim(path)
    remove_claim(path)
    assert not path.exists()


def test_live_claims_counts_only_live_pids_and_skips_foreign_files(tmp_path: Path) -> None:
    (tmp_path / str(os.getpid())).write_text("300\n")
    (tmp_path / str(os.getppid())).write_text("50 1\n")  # "<bytes> <device>" is read as bytes
    (tmp_path / str(_dead_pid())).write_text("1000000\n")
    (tmp_path / "notes.txt").write_text("999\n")
    (tmp_path / ".77.partial").write_text("999\n")
    assert live_claims(tmp_path) == 350
    assert live_claims(tmp_path, exclude_pid=os.getpid()) == 50


def test_live_claims_skips_garbage_and_missing_directories(tmp_path: Path) -> None:
    (tmp_path / str(os.getpid())).write_text("lots\n")
    assert live_claims(tmp_path) == 0
    assert live_claims(tmp_path / "absent") == 0


def test_out_of_memory_reports_need_and_free_bytes(tmp_path: Path) -> None:
    (tmp_path / str(os.getppid())).write_text("3000\n")
    assert out_of_memory(tmp_path, os.getpid(), need=1000, total=4000) is None
    message = out_of_memory(tmp_path, os.getpid(), need=1001, total=4000)
    assert message == "CUDA error: out of memory (demo: need 1001 bytes, 1000 free)"


def test_out_of_memory_never_reports_negative_free(tmp_path: Path) -> None:
    (tmp_path / str(os.getppid())).write_text("5000\n")
    assert out_of_memory(tmp_path, os.getpid(), need=1, total=4000) == (
        "CUDA error: out of memory (demo: need 1 bytes, 0 free)"
    )
