"""`llmswap check-config`, argument errors and config errors at startup: output and exit statuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmswap import __version__
from llmswap.cli.main import main, parse_listen

CONFIG = """\
macros:
  serve: /opt/llama/llama-server --port ${PORT}
startPort: 9100
models:
  qwen:
    cmd: ${serve} -m qwen.gguf
    aliases: [gpt-4o-mini]
  llama:
    cmd: |
      ${serve}
        # the model file
        -m llama.gguf
"""

BROKEN = """\
models:
  qwen:
    cmd: llama-server --port ${PORT}
    ttl: -5
"""


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_check_config_prints_the_resolved_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(write(tmp_path, CONFIG))]) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    models = resolved["models"]
    # Ports go to models in sorted id order: llama first.
    assert models["llama"]["proxy"] == "http://localhost:9100"
    assert models["qwen"]["proxy"] == "http://localhost:9101"
    assert "/opt/llama/llama-server --port 9101 -m qwen.gguf" in str(models["qwen"])
    assert "${" not in out


def test_check_config_lists_errors_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BROKEN)
    assert main(["check-config", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{path}:4: models.qwen.ttl" in captured.err
    assert "-5" in captured.err
    assert "Traceback" not in captured.err


def test_check_config_of_a_missing_file_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["check-config", str(missing)]) == 1
    assert str(missing) in capsys.readouterr().err


def test_check_config_prints_warnings_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, CONFIG + "mysteryKey: 1\n")
    assert main(["check-config", str(path)]) == 0
    captured = capsys.readouterr()
    assert "mysteryKey" in captured.err
    assert captured.err.startswith("warning: ")
    assert "qwen" in captured.out
    assert (captured.out + captured.err).count("mysteryKey") == 1  # each warning once


def test_serving_a_broken_config_exits_1_with_the_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BROKEN)
    assert main(["--config", str(path), "--listen", "127.0.0.1:0"]) == 1
    err = capsys.readouterr().err
    assert f"{path}:4: models.qwen.ttl" in err
    assert "check-config" in err
    assert "Traceback" not in err


def test_serving_without_config_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "--config FILE is required" in capsys.readouterr().err


def test_bad_listen_address_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(write(tmp_path, CONFIG)), "--listen", "localhost"])
    assert exit_info.value.code == 2
    assert "HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:8080", ("127.0.0.1", 8080)), (":9000", ("", 9000)), ("[::1]:80", ("::1", 80)),
     ("0.0.0.0:0", ("0.0.0.0", 0))],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


def test_unknown_log_level_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(write(tmp_path, CONFIG)), "--log-level", "verbose"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'verbose'" in capsys.readouterr().err


def test_tasks_commands_are_reachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "list", "--config", str(write(tmp_path, CONFIG))]) == 1
    assert "no tasks: section" in capsys.readouterr().err


def test_console_script_reports_version_and_checks_a_config(tmp_path: Path) -> None:
    version = subprocess.run([sys.executable, "-m", "llmswap", "--version"], capture_output=True, text=True,
                             timeout=30, check=False)
    assert version.returncode == 0
    assert version.stdout.strip() == f"llmswap {__version__}"
    broken = subprocess.run([sys.executable, "-m", "llmswap", "check-config", str(write(tmp_path, BROKEN))],
                            capture_output=True, text=True, timeout=30, check=False)
    assert broken.returncode == 1
    assert "models.qwen.ttl" in broken.stderr
    assert "Traceback" not in broken.stderr
