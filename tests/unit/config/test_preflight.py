"""`check-config`'s look at each model's command: its program on the PATH it runs with, its model files."""

from __future__ import annotations

import sys
from pathlib import Path

from llmswap.config.preflight import command_warnings

from .support import load


def test_a_program_not_on_path_and_a_missing_model_file_are_named_with_their_fix(tmp_path: Path) -> None:
    present = tmp_path / "present.gguf"
    present.write_bytes(b"GGUF")
    config = load(f"""
        models:
          ok:
            cmd: {sys.executable} -m llmswap.demo --port ${{PORT}} -m {present}
          lost:
            cmd: no-such-server-here --port ${{PORT}} --model={tmp_path / 'absent.gguf'}
            env: ["PATH=/usr/bin:/bin"]
          wrong:
            cmd: /nowhere/llama-server --port ${{PORT}}
        """)
    assert command_warnings(config) == [
        "models.lost.cmd: 'no-such-server-here' is not on the PATH llmswap runs it with (/usr/bin:/bin); "
        "give its full path in cmd, or add its folder to PATH (env sets it for one model)",
        f"models.lost.cmd: --model {tmp_path / 'absent.gguf'}: no such file; fix the path (relative paths "
        "are read from the folder llmswap runs in)",
        "models.wrong.cmd: /nowhere/llama-server does not exist; fix the path, or install the program there",
    ]
