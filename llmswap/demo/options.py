"""The demo's command line: parsed into one frozen ``DemoOptions`` value, with errors that name the flag."""

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmswap.demo.sizes import parse_size


@dataclass(frozen=True)
class DemoOptions:
    """Everything the demo was asked to do; sizes in bytes, durations in seconds."""

    port: int
    model_name: str
    host: str = "127.0.0.1"
    startup_delay: float = 0.0
    tokens_per_second: float = 0.0  # 0 = as fast as possible
    exit_after: float | None = None
    never_healthy: bool = False
    healthy_when: Path | None = None  # stays unhealthy until this file exists
    ignore_sigterm: bool = False
    echo: bool = False
    spawn_grandchild: bool = False
    fake_vram: int | None = None
    fake_gpu_dir: Path | None = None
    fake_gpu_total: int | None = None
    log_requests: bool = False
    sleep_mode: bool = False  # vLLM's sleep API (llmswap.demo.sleep_api)
    sleep_delay: float = 0.0
    wake_delay: float = 0.0
    sleep_residue: int = 0  # bytes of the fake GPU claim kept while asleep (a CUDA context)
    weights: Path | None = None  # read whole before it is healthy, as a server loads its model
    mmproj: Path | None = None  # named and never read
    slot_save_path: Path | None = None  # llama-server's slot save API, saving into this folder
    kv_bytes_per_token: int = 1024  # the size of a slot's save per token
    prompt_per_second: float = 0.0  # paces prompt processing (0 = as fast as possible)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _non_negative(what: str, example: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (e.g. {example})") from None
        if not value >= 0:  # also rejects nan
            raise argparse.ArgumentTypeError(f"must be {what} >= 0, got {text!r}")
        return value

    return parse


_seconds = _non_negative("a number of seconds", "0.5")
_rate = _non_negative("a number of tokens per second", "20")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535 (0 = any free port), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llmswap.demo",
        description="A small OpenAI/Anthropic-compatible model server for llmswap's examples and tests. "
        "Its answers are deterministic text naming --model-name.",
    )
    parser.add_argument("--port", type=_port, required=True, help="TCP port to listen on (0 = any free port)")
    parser.add_argument("--model-name", required=True, help="the model this server pretends to be")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--startup-delay",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="/health answers 503 until S seconds after process start (default 0)",
    )
    parser.add_argument(
        "--tokens-per-second",
        type=_rate,
        default=0.0,
        metavar="R",
        help="pace generated tokens at R per second (default 0 = as fast as possible)",
    )
    knobs = parser.add_argument_group("test knobs")
    knobs.add_argument(
        "--exit-after", type=_seconds, metavar="S", help="exit with code 3 S seconds after start (a crash)"
    )
    knobs.add_argument("--never-healthy", action="store_true", help="/health answers 503 forever")
    knobs.add_argument(
        "--healthy-when", type=Path, metavar="FILE",
        help="/health answers 503 until FILE exists (and the startup delay has passed)",
    )
    knobs.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM (only SIGKILL stops it)")
    knobs.add_argument(
        "--echo",
        action="store_true",
        help="add the received request (method, path, query, headers, body) to every JSON answer",
    )
    knobs.add_argument(
        "--spawn-grandchild",
        action="store_true",
        help="start a long-lived child process in the same process group and print its pid",
    )
    knobs.add_argument(
        "--fake-vram",
        type=_size,
        metavar="SIZE",
        help="once healthy, claim SIZE of fake GPU memory by writing DIR/<pid> (needs --fake-gpu-dir)",
    )
    knobs.add_argument("--fake-gpu-dir", type=Path, metavar="DIR", help="directory of fake GPU memory claims")
    knobs.add_argument(
        "--fake-gpu-total",
        type=_size,
        metavar="SIZE",
        help="fake GPU size: exit 1 with a CUDA out-of-memory error at start if the live claims in "
        "--fake-gpu-dir plus --fake-vram exceed it",
    )
    knobs.add_argument("--log-requests", action="store_true", help="print one line per request to stdout")
    knobs.add_argument("--enable-sleep-mode", action="store_true",
                       help="serve vLLM's sleep API: POST /sleep, POST /wake_up, GET /is_sleeping")
    knobs.add_argument("--sleep-delay", type=_seconds, default=0.0, metavar="S",
                       help="seconds a POST /sleep takes (default 0)")
    knobs.add_argument("--wake-delay", type=_seconds, default=0.0, metavar="S",
                       help="seconds a POST /wake_up takes (default 0)")
    knobs.add_argument("--weights", type=Path, metavar="FILE",
                       help="a file standing for the model's weights: read whole before /health answers 200, "
                            "as a server loads its model (so a cold page cache makes the start slower)")
    knobs.add_argument("--mmproj", type=Path, metavar="FILE",
                       help="a file the command names and the server never reads (as an unused projector)")
    knobs.add_argument("--slot-save-path", type=Path, metavar="DIR",
                       help="serve llama-server's slot API (GET /slots, POST /slots/0?action=save|restore), "
                            "saving into DIR")
    knobs.add_argument("--kv-bytes-per-token", type=_size, default=1024, metavar="SIZE",
                       help="bytes a slot's save holds per token (default 1KiB)")
    knobs.add_argument("--prompt-per-second", type=_rate, default=0.0, metavar="R",
                       help="process a chat's prompt at R tokens per second before answering (default 0 = "
                            "at once); its `timings` say so")
    knobs.add_argument("--sleep-residue", type=_size, default=0, metavar="SIZE",
                       help="of --fake-vram, what stays claimed while asleep (a CUDA context; default 0)")
    return parser


def parse_options(argv: Sequence[str] | None = None) -> DemoOptions:
    """Parse ``argv`` (default: sys.argv); on a bad flag print the problem and exit 2, like any CLI."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.fake_vram is not None and args.fake_gpu_dir is None:
        parser.error("--fake-vram needs --fake-gpu-dir DIR to say where the claim file goes")
    if args.fake_gpu_total is not None and args.fake_gpu_dir is None:
        parser.error("--fake-gpu-total needs --fake-gpu-dir DIR to read the other claims from")
    if not args.model_name.strip():
        parser.error("--model-name must not be empty")
    return DemoOptions(
        port=args.port,
        model_name=args.model_name,
        host=args.host,
        startup_delay=args.startup_delay,
        tokens_per_second=args.tokens_per_second,
        exit_after=args.exit_after,
        never_healthy=args.never_healthy,
        healthy_when=args.healthy_when,
        ignore_sigterm=args.ignore_sigterm,
        echo=args.echo,
        spawn_grandchild=args.spawn_grandchild,
        fake_vram=args.fake_vram,
        fake_gpu_dir=args.fake_gpu_dir,
        fake_gpu_total=args.fake_gpu_total,
        log_requests=args.log_requests,
        sleep_mode=args.enable_sleep_mode,
        sleep_delay=args.sleep_delay,
        wake_delay=args.wake_delay,
        sleep_residue=args.sleep_residue,
        weights=args.weights,
        mmproj=args.mmproj,
        slot_save_path=args.slot_save_path,
        kv_bytes_per_token=args.kv_bytes_per_token,
        prompt_per_second=args.prompt_per_second,
    )
