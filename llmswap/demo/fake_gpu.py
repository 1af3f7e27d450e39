"""The demo's stand-in for GPU memory: one claim file per live demo in a shared directory.

A demo run with ``--fake-vram SIZE --fake-gpu-dir DIR`` writes ``DIR/<pid>`` holding SIZE in bytes (decimal)
once it is healthy and removes it when it exits. A SIGKILLed demo cannot remove its file, so readers count
only files whose pid is alive, which is also how a real GPU frees the memory of a killed process. The fake
GPU reader in ``llmswap/machine/`` reads the same files.
"""

import os
from pathlib import Path


def claim_path(directory: Path, pid: int) -> Path:
    return directory / str(pid)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a running process (a zombie has already let go of its memory)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: os.kill is all we can know
    # The state letter follows the parenthesised command name, which may itself contain ") ".
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] not in ("Z", "X")


def write_claim(directory: Path, pid: int, size: int) -> Path:
    """Write ``DIR/<pid>`` atomically: readers see either no file or the whole number."""
    path = claim_path(directory, pid)
    partial = directory / f".{pid}.partial"
    partial.write_text(f"{size}\n")
    os.replace(partial, path)
    return path


def remove_claim(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def live_claims(directory: Path, *, exclude_pid: int | None = None) -> int:
    """Bytes claimed by the live processes in ``directory``; unreadable or foreign files are skipped."""
    total = 0
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return 0
    for entry in entries:
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == exclude_pid or not pid_alive(pid):
            continue
        try:
            fields = entry.read_text().split()
            total += int(fields[0])
        except (OSError, ValueError, IndexError):
            continue  # removed or half-written by a foreign writer while we looked
    return total


def out_of_memory(directory: Path, pid: int, need: int, total: int) -> str | None:
    """The CUDA-style error a real server would print if ``need`` more bytes do not fit, else None."""
    used = live_claims(directory, exclude_pid=pid)
    if used + need <= total:
        return None
    return f"CUDA error: out of memory (demo: need {need} bytes, {max(0, total - used)} free)"
