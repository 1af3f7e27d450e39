from pathlib import Path

import pytest

from llmswap.demo.options import DemoOptions, parse_options


def test_defaults_need_only_port_and_model_name() -> None:
    options = parse_options(["--port", "8001", "--model-name", "qwen"])
    assert options == DemoOptions(port=8001, model_name="qwen")


def test_every_knob_is_parsed() -> None:
    options = parse_options(
        [
            "--port", "0", "--model-name", "m", "--host", "127.0.0.2", "--startup-delay", "0.5",
            "--tokens-per-second", "20", "--exit-after", "3", "--never-healthy", "--ignore-sigterm", "--echo",
            "--spawn-grandchild", "--fake-vram", "2GB", "--fake-gpu-dir", "/tmp/gpu",
            "--fake-gpu-total", "8GiB", "--log-requests", "--healthy-when", "/tmp/gate",
        ]
    )  # fmt: skip
    assert options == DemoOptions(
        port=0,
        model_name="m",
        host="127.0.0.2",
        startup_delay=0.5,
        tokens_per_second=20.0,
        exit_after=3.0,
        never_healthy=True,
        healthy_when=Path("/tmp/gate"),
        ignore_sigterm=True,
        echo=True,
        spawn_grandchild=True,
        fake_vram=2_000_000_000,
        fake_gpu_dir=Path("/tmp/gpu"),
        fake_gpu_total=8 * 2**30,
        log_requests=True,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--startup-delay", "-1"], "--startup-delay: must be a number of seconds >= 0"),
        (["--tokens-per-second", "fast"], "'fast' is not a number of tokens per second"),
        (["--fake-vram", "2XB", "--fake-gpu-dir", "d"], "unknown unit 'XB'"),
        (["--fake-vram", "2GB"], "--fake-vram needs --fake-gpu-dir"),
        (["--fake-gpu-total", "2GB"], "--fake-gpu-total needs --fake-gpu-dir"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_options(["--port", "1", "--model-name", "m", *extra])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_port_out_of_range_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_options(["--port", "70000", "--model-name", "m"])
    assert "between 0 and 65535" in capsys.readouterr().err
