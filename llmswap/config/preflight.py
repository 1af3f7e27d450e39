"""What `llmswap check-config` checks beyond the file itself: that each model's command can start.

A config can be valid and still unable to start a model: its program is not on the PATH llmswap will run it
with, or the model file it names is not there. Loading never fails for these (a program may be installed,
a file mounted, after the check); `check-config` warns about them, naming the model, the key and the fix.
Read-only: it looks up files, it runs nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from llmswap.config.model import Config, ModelConfig

# Arguments that name a model file to llama-server (and llama.cpp's other servers): the model, a projector, a
# draft model, a LoRA adapter.
FILE_FLAGS = ("-m", "--model", "--mmproj", "-md", "--model-draft", "--lora")
MODEL_SUFFIXES = (".gguf", ".bin", ".safetensors")


def command_warnings(config: Config) -> list[str]:
    """One warning per model whose program cannot be found or whose model file does not exist."""
    found: list[str] = []
    for model in config.models.values():
        found += _model_warnings(model)
    return found


def _model_warnings(model: ModelConfig) -> list[str]:
    if not model.cmd:
        return []
    where = f"models.{model.id}.cmd"
    env = dict(model.env)
    path = env.get("PATH", os.environ.get("PATH", ""))
    program = model.cmd[0]
    found: list[str] = []
    if os.sep in program:
        if not Path(program).expanduser().is_file():
            found.append(f"{where}: {program} does not exist; fix the path, or install the program there")
    elif shutil.which(program, path=path) is None:
        found.append(f"{where}: {program!r} is not on the PATH llmswap runs it with ({path or 'empty'}); "
                     f"give its full path in cmd, or add its folder to PATH (env sets it for one model)")
    for flag, value in _file_arguments(model.cmd):
        if not Path(value).expanduser().exists():
            found.append(f"{where}: {flag} {value}: no such file; fix the path (relative paths are read from "
                         f"the folder llmswap runs in)")
    return found


def _file_arguments(argv: tuple[str, ...]) -> list[tuple[str, str]]:
    """The model files `argv` names: FILE_FLAGS values that look like paths."""
    pairs: list[tuple[str, str]] = []
    for index, part in enumerate(argv):
        flag, equals, value = part.partition("=")
        if equals and flag in FILE_FLAGS:
            pairs.append((flag, value))
        elif part in FILE_FLAGS and index + 1 < len(argv):
            pairs.append((part, argv[index + 1]))
    return [(flag, value) for flag, value in pairs if _looks_like_a_path(value)]


def _looks_like_a_path(value: str) -> bool:
    """`/srv/m.gguf`, `~/m.gguf`, `./m.gguf`, `m.gguf`; not `llmswap.demo` (python -m) nor `org/name` (a
    model repository vLLM downloads)."""
    return value.startswith(("/", "~", "./", "../")) or value.endswith(MODEL_SUFFIXES)
