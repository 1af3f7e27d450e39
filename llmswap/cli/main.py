"""The `llmswap` command: parse the arguments, load the config, hand over to the server's lifecycle.

    llmswap --config FILE [--config-dir DIR] [--listen HOST:PORT] [--watch-config] [--log-level LEVEL]
            [--tls-cert-file FILE --tls-key-file FILE]
    llmswap check-config FILE | --config FILE [--config-dir DIR]
    llmswap tasks submit|list|show|cancel --config FILE ...
    llmswap ps|load MODEL|unload [MODEL] [--url URL]   (admin commands against a running llmswap)
    llmswap --version

llama-swap's own spellings (`-config`, `-config-dir`, `-listen`, `-watch-config`, `-tls-cert-file`,
`-tls-key-file`, `-version`) are accepted as they are (`llmswap.cli.args`).

Exit status: 0 after a clean stop (or a valid config), 1 for a config that does not load or an address
that cannot be listened on, 2 for bad arguments. Errors go to stderr as text, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from llmswap import __version__
from llmswap.cli import admin as admin_cli
from llmswap.cli import tasks as task_cli
from llmswap.cli.args import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    add_config_arguments,
    add_tls_arguments,
    config_sources,
    flag,
    listen_address,
    parse_listen,
)
from llmswap.config import Config, ConfigError, ConfigSources, format_config
from llmswap.config.preflight import command_warnings
from llmswap.config.schema import schema_text

LOG_LEVELS = ("debug", "info", "warn", "error")


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
    add_config_arguments(parser)
    flag(parser, "listen", metavar="HOST:PORT", type=parse_listen,
         help=f"address to serve on (default {DEFAULT_HOST}:{DEFAULT_PORT}, or {DEFAULT_HOST}:"
              f"{DEFAULT_TLS_PORT} with TLS; ':8080' = every interface, port 0 = any free port)")
    flag(parser, "watch-config", action="store_true", dest="watch_config",
         help="reload the config when a file changes (SIGHUP always reloads): with --config-dir, files "
              "added, changed or removed there count too; models whose settings did not change keep "
              "running, the others restart on demand; a config that does not load is ignored and the "
              "running one kept")
    flag(parser, "log-level", choices=LOG_LEVELS, metavar="LEVEL", dest="log_level",
         help=f"one of {', '.join(LOG_LEVELS)}; overrides the config's logLevel")
    add_tls_arguments(parser)
    flag(parser, "shutdown-grace", type=_seconds, default=None, metavar="SECONDS", dest="shutdown_grace",
         help="on SIGINT/SIGTERM, how long the answers in flight get to finish before they are ended with "
              "an error (default 10)")
    flag(parser, "version", action="version", version=f"llmswap {__version__}")

    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = commands.add_parser(
        "check-config", help="load a config file and print it resolved (macros expanded, ports assigned)",
        description="Load the config (FILE, or --config and --config-dir) and print it as llmswap "
                    "understands it: files merged, macros expanded, ${PORT}s assigned, defaults applied, "
                    "API keys redacted. Problems are printed to stderr, each with its file:line, and the "
                    "exit status is 1.",
    )
    check.add_argument("file", metavar="FILE", type=Path, nargs="?", help="the config file to check")
    add_config_arguments(check, subcommand=True)

    commands.add_parser(
        "schema", help="print the config's JSON Schema (what config-schema.json holds), for editors",
        description="Print the JSON Schema (draft 2020-12) of llmswap's config file: every key it accepts, "
                    "llama-swap's and its own, with its type, default and what it does. Editors check a "
                    "config.yaml against it: begin the file with `# yaml-language-server: "
                    "$schema=config-schema.json` (a path or URL of the schema).",
    )
    task_cli.add_parser(commands)
    admin_cli.add_parsers(commands)
    return parser


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{text} seconds: give 0 to 3600")
    return seconds


def _load(sources: ConfigSources) -> Config | None:
    """The config the sources make, or None after printing why it does not load."""
    try:
        return sources.load()
    except ConfigError as err:
        print(err, file=sys.stderr)
        return None


def check_config(sources: ConfigSources) -> int:
    config = _load(sources)
    if config is None:
        return 1
    for warning in config.warnings:  # once, on stderr: not again as comments in the config printed
        print(f"warning: {warning}", file=sys.stderr)
    shown = f"{config.path}: " if config.path else ""
    for warning in command_warnings(config):
        print(f"warning: {shown}{warning}", file=sys.stderr)
    print(format_config(config, warnings=False), end="")
    return 0


def serve_command(sources: ConfigSources, args: argparse.Namespace, host: str, port: int) -> int:
    from llmswap.server.lifecycle import SHUTDOWN_GRACE, ServeOptions, StartError, run

    config = _load(sources)
    if config is None:
        given = f" --config {sources.file}" if sources.file else ""
        given += f" --config-dir {sources.directory}" if sources.directory else ""
        print(f"llmswap: not started: fix the problems above (`llmswap check-config{given}` "
              f"checks the config without starting)", file=sys.stderr)
        return 1
    grace = SHUTDOWN_GRACE if args.shutdown_grace is None else args.shutdown_grace
    options = ServeOptions(config_path=sources.file, config_dir=sources.directory, host=host, port=port,
                           watch_config=args.watch_config, log_level=args.log_level,
                           tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file,
                           shutdown_grace=grace)
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
        return check_config(config_sources(args, parser, file=args.file))
    if args.command == "schema":
        sys.stdout.write(schema_text())
        return 0
    if args.command == "tasks":
        return task_cli.run(config_sources(args, parser), args)
    if args.command in admin_cli.COMMANDS:
        return admin_cli.run(args)
    host, port = listen_address(args, parser)
    return serve_command(config_sources(args, parser), args, host, port)


if __name__ == "__main__":
    raise SystemExit(main())
