"""The command line's shared vocabulary: llama-swap's flags, the config sources, the listen address.

llama-swap is a Go program, and Go's flag package takes `-config` and `--config` alike; its users run
`llama-swap -config /app/config.yaml -watch-config`. Every long flag here is therefore registered in both
spellings. argparse matches a registered option string exactly before it tries to split a single-dash
word into short options, and llmswap defines no short option but `-h`, so `-config` is never read as
`-c onfig`. `-config=FILE` works as `--config=FILE` does; anything after `--` is left alone.

`add_config_arguments` gives the main parser and every subcommand the same `--config FILE` and
`--config-dir DIR`; a subcommand's copy defaults to "not given", so `llmswap --config F tasks list` and
`llmswap tasks list --config F` mean the same.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from llmswap.config import ConfigSources

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_TLS_PORT = 8443  # llama-swap's default with -tls-cert-file and -tls-key-file


def flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, **options: Any) -> None:
    """Add `--name`, also spelled `-name` as llama-swap (Go's flag package) spells it."""
    parser.add_argument(f"--{name}", f"-{name}", **options)


def add_config_arguments(parser: argparse.ArgumentParser, *, subcommand: bool = False) -> None:
    default = argparse.SUPPRESS if subcommand else None
    flag(parser, "config", metavar="FILE", type=Path, default=default,
         help="the YAML config file (llama-swap's format plus llmswap's additions)")
    flag(parser, "config-dir", metavar="DIR", type=Path, default=default, dest="config_dir",
         help="a directory whose *.yaml and *.yml files are merged into the config, after --config and "
              "in name order: mappings merge, lists join, a model (group, peer, ...) is defined in one "
              "file only")


def config_sources(args: argparse.Namespace, parser: argparse.ArgumentParser, *, file: Path | None = None,
                   ) -> ConfigSources:
    """The sources the arguments name (`file`: a positional FILE, as `check-config FILE` takes one).
    Exits through `parser.error` (status 2) when none is given."""
    config: Path | None = getattr(args, "config", None)
    directory: Path | None = getattr(args, "config_dir", None)
    if file is not None:
        if config is not None and config != file:
            parser.error(f"two config files given ({file} and --config {config}); give one")
        config = file
    if config is None and directory is None:
        parser.error("--config FILE is required (or --config-dir DIR, or both)")
    return ConfigSources(config, directory)


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


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    flag(parser, "tls-cert-file", metavar="FILE", type=Path, dest="tls_cert_file",
         help="serve HTTPS with this certificate (PEM; the chain after the server's own certificate); "
              "needs --tls-key-file")
    flag(parser, "tls-key-file", metavar="FILE", type=Path, dest="tls_key_file",
         help="the certificate's private key (PEM, not encrypted); needs --tls-cert-file")


def listen_address(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, int]:
    """--listen, or the default: 127.0.0.1:8080, or 127.0.0.1:8443 with TLS (llama-swap's TLS port)."""
    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        parser.error("both --tls-cert-file and --tls-key-file must be given for HTTPS")
    if args.listen is not None:
        return args.listen
    return DEFAULT_HOST, DEFAULT_TLS_PORT if args.tls_cert_file is not None else DEFAULT_PORT
