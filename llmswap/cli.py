"""The `llmswap` command: parse the arguments, load the config, hand over to the server's lifecycle.

    llmswap --config FILE [--listen HOST:PORT] [--watch-config] [--log-level LEVEL]
    llmswap check-config FILE
    llmswap tasks submit|list|show|cancel --config FILE ...
    llmswap ps|load MODEL|unload [MODEL] [--url URL]   (admin commands against a running llmswap)
    llmswap --version

Exit status: 0 after a clean stop (or a valid config), 1 for a config that does not load or an address
that cannot be listened on, 2 for bad arguments. Errors go to stderr as text, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from llmswap import __version__, admin_cli
from llmswap.config import Config, ConfigError, format_config, load_config
from llmswap.tasks import cli as task_cli

LOG_LEVELS = ("debug", "info", "warn", "error")
DEFAULT_LISTEN = "127.0.0.1:8080"


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[IPv6]:PORT` or `:PORT` (every interface) → (host, port); host "" = every interface."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8080 or :8080)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise argparse.ArgumentTypeError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:8080")
    try:
        port = int(port_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: the port must be from 0 to 65535 (0 = any free port)")
    return host, port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmswap",
        description=(
            "A model-swapping reverse proxy for local OpenAI- and Anthropic-compatible model servers "
            "(llama.cpp's llama-server, vLLM, ...). It reads the model of each request, starts the "
            "upstream server that serves it, stops the ones that must make room, and streams the answer "
            "back. Configuration files written for llama-swap work unchanged."
        ),
        epilog="Run `llmswap check-config FILE` to see how a config file is understood.",
    )
    parser.add_argument("--config", metavar="FILE", type=Path,
                        help="the YAML config file (llama-swap's format plus llmswap's additions)")
    parser.add_argument("--listen", metavar="HOST:PORT", type=parse_listen, default=DEFAULT_LISTEN,
                        help=f"address to serve on (default {DEFAULT_LISTEN}; ':8080' = every interface, "
                             "port 0 = any free port)")
    parser.add_argument("--watch-config", action="store_true",
                        help="reload the config when the file changes (SIGHUP always reloads): models "
                             "whose settings did not change keep running, the others restart on demand; "
                             "a file that does not load is ignored and the running config kept")
    parser.add_argument("--log-level", choices=LOG_LEVELS, metavar="LEVEL",
                        help=f"one of {', '.join(LOG_LEVELS)}; overrides the config's logLevel")
    parser.add_argument("--version", action="version", version=f"llmswap {__version__}")

    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = commands.add_parser(
        "check-config", help="load a config file and print it resolved (macros expanded, ports assigned)",
        description="Load FILE and print the configuration as llmswap understands it: macros expanded, "
                    "${PORT}s assigned, defaults applied, API keys redacted. Problems are printed to "
                    "stderr, each with its file:line, and the exit status is 1.",
    )
    check.add_argument("file", metavar="FILE", type=Path, help="the config file to check")

    task_cli.add_parser(commands)
    admin_cli.add_parsers(commands)
    return parser


def _load(path: Path) -> Config | None:
    """The config at `path`, or None after printing why it does not load."""
    try:
        return load_config(path)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return None


def check_config(path: Path) -> int:
    config = _load(path)
    if config is None:
        return 1
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(format_config(config), end="")
    return 0


def serve_command(args: argparse.Namespace) -> int:
    from llmswap.server.lifecycle import ServeOptions, StartError, run

    config = _load(args.config)
    if config is None:
        print(f"llmswap: not started: fix the problems above (`llmswap check-config {args.config}` "
              f"checks the file without starting)", file=sys.stderr)
        return 1
    host, port = args.listen
    options = ServeOptions(config_path=args.config, host=host, port=port, watch_config=args.watch_config,
                           log_level=args.log_level)
    try:
        return run(options, config)
    except StartError as err:
        print(f"llmswap: not started: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file)
    if args.command == "tasks":
        return task_cli.run(args)
    if args.command in admin_cli.COMMANDS:
        return admin_cli.run(args)
    if args.config is None:
        parser.error("--config FILE is required to serve (or give a command: check-config, tasks)")
    return serve_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
