"""How much of a file the page cache holds (`mincore`), and how to empty it of one file (`drop`).

The prefetch tests check where a file's pages are, not how long a read took: no wall-clock threshold.
`drop` asks the kernel to evict the file's clean pages (POSIX_FADV_DONTNEED), which needs no root.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
MAP_FAILED = ctypes.c_void_p(-1).value


def resident_fraction(path: Path) -> float:
    """The fraction of `path`'s pages in the page cache now (mapping it reads nothing)."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(byte & 1 for byte in vector) / pages
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


def drop(path: Path) -> None:
    """Evict `path`'s clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
