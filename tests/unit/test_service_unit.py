"""examples/llmswap.service: systemd accepts it (`systemd-analyze verify`, where systemd is installed), and
its stop leaves llmswap the time of its own graceful stop."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "examples" / "llmswap.service"
MODEL_STOP = 5 + 2  # a model server's SIGTERM-to-SIGKILL wait, and llmswap's own margin (README "Stopping")


def service_section() -> dict[str, str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return dict(parser["Service"])


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    llmswap = Path(sys.executable).with_name("llmswap")
    copy = tmp_path / "llmswap.service"  # ExecStart names this checkout's llmswap: verify checks it exists
    copy.write_text(UNIT.read_text().replace("/opt/llmswap/bin/llmswap", str(llmswap)))
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "llmswap.service" not in done.stderr, done.stderr  # no warning about the unit itself


def test_the_stop_is_llmswaps_own_and_its_grace_fits_in_the_timeout() -> None:
    service = service_section()
    grace = float(re.search(r"--shutdown-grace (\d+)", service["ExecStart"]).group(1))  # type: ignore[union-attr]
    assert service["KillMode"] == "mixed"  # SIGTERM to llmswap alone: it stops its model servers itself
    assert float(service["TimeoutStopSec"]) >= grace + MODEL_STOP
    assert service["Restart"] == "on-failure" and service["StateDirectory"] == "llmswap"
    assert service["User"] == "llmswap" and "--watch-config" in service["ExecStart"]
    assert service["Environment"] == "LLMSWAP_STATE_DIR=/var/lib/llmswap"
