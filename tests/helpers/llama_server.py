"""llama.cpp's own `llama-server` (built by .ci/install-llama-server.sh) for the end-to-end tests and bench.

`llama_server_binary()` finds it: `LLAMA_SERVER` if set, else beside the running Python (.venv/bin, where
the install script puts it), else on PATH. `llama_server_argv(...)` is the command line that serves one
generated GGUF (tests/helpers/gguf_model.py) on llmswap's `${PORT}`, with its slot saves in `${KV_DIR}`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def llama_server_binary() -> str | None:
    given = os.environ.get("LLAMA_SERVER")
    if given:
        return given if Path(given).is_file() else None
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file():
        return str(beside)
    return shutil.which("llama-server")


def llama_server_argv(binary: str, model: Path, *, context: int, slots: int = 1, threads: int = 1,
                      port: str = "${PORT}", kv_dir: str | None = "${KV_DIR}",
                      alias: str = "${MODEL_ID}") -> list[str]:
    """One thread by default, so the server and llmswap share 2 cores without thrashing. `context` is the
    whole context, which llama-server splits evenly between its `slots`. No warm-up run: a start is the
    model load and nothing else, as in the swaps being measured. `--alias` names the model in answers
    (llama-server's default is the file's path)."""
    argv = [binary, "--host", "127.0.0.1", "--port", port, "-m", str(model), "--alias", alias,
            "-c", str(context * slots),
            "-np", str(slots), "-t", str(threads), "-tb", str(threads), "--no-warmup"]
    if kv_dir is not None:
        argv += ["--slot-save-path", kv_dir]
    return argv
