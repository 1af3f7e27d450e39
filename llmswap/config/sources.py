"""Where the configuration comes from: a file (`--config`), a directory of files (`--config-dir`), or both.

With a directory, the file (if any) comes first, then every `*.yaml`/`*.yml` directly in the directory
(not in subdirectories), in name order; each gets its `${env.NAME}`s and is parsed on its own, then
`llmswap.config.merge` joins them and the merged tree is loaded like one file. Problems name the file
and line each setting was written at. `paths()` is what a watcher looks at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llmswap.config.errors import ConfigError, Problem, Problems, Source
from llmswap.config.loader import (
    load_config,
    load_tree,
    parse_config_text,
    parse_written_text,
    read_config_text,
    uses_env,
)
from llmswap.config.merge import merge_trees, renumber
from llmswap.config.model import Config
from llmswap.config.yamltree import Map

YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class ConfigSources:
    """`file`, `directory` or both; `load()` reads them all again, so a reload sees added files."""

    file: Path | None = None
    directory: Path | None = None

    def __post_init__(self) -> None:
        if self.file is None and self.directory is None:
            raise ValueError("give a config file, a config directory, or both")

    def __str__(self) -> str:
        if self.directory is None:
            return str(self.file)
        where = f"{self.directory}/*.yaml"
        return where if self.file is None else f"{self.file} + {where}"

    def directory_files(self) -> list[Path]:
        """The YAML files directly in `directory`, in name order; raises `ConfigError` if it is unreadable."""
        if self.directory is None:
            return []
        try:
            found = [
                path
                for path in self.directory.iterdir()
                if path.suffix in YAML_SUFFIXES and path.is_file()
            ]
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigError(
                [Problem(str(self.directory), None, "", f"cannot read the config directory: {reason}; "
                                                       "check the --config-dir path")]
            ) from None
        return sorted(found, key=lambda path: path.name)

    def paths(self) -> list[Path]:
        """Every file the config is read from, in merge order."""
        files = self.directory_files()
        if self.file is None:
            return files
        main = self.file.expanduser().absolute()
        if any(path.expanduser().absolute() == main for path in files):
            raise ConfigError(
                [Problem(str(self.file), None, "", f"is also in --config-dir {self.directory}; "
                                                  "give it only once (remove it from one of the two)")]
            )
        return [self.file, *files]

    def load(self, *, environ: Mapping[str, str] | None = None) -> Config:
        """The merged config; raises `ConfigError` listing every problem in every file."""
        if self.directory is None:
            assert self.file is not None
            return load_config(self.file, environ=environ)
        paths = self.paths()
        if not paths:
            raise ConfigError(
                [Problem(str(self.directory), None, "", "no configuration sources found: the directory has "
                                                       "no *.yaml or *.yml file; add one or give --config")]
            )
        trees: list[Map] = []
        texts: list[str] = []
        sources: list[Source] = []
        failed: list[Problem] = []
        warnings: list[Problem] = []
        next_line = 1
        for path in paths:
            try:
                text = read_config_text(path)
                problems = Problems(str(path))
                tree = parse_config_text(text, problems, environ)
            except ConfigError as err:
                failed.extend(err.problems)
                continue
            failed.extend(problems.errors)
            warnings.extend(problems.warnings)
            renumber(tree, next_line - 1)
            trees.append(tree)
            texts.append(text)
            sources.append(Source(str(path), next_line))
            next_line += text.count("\n") + 1
        if failed:
            raise ConfigError(failed)
        shown = self.file if self.file is not None else self.directory
        merged = Problems(str(shown), warnings=warnings, sources=tuple(sources))
        tree = merge_trees(trees, merged)
        base_dir = self.file.expanduser().absolute().parent if self.file else self.directory.absolute()
        return load_tree(tree, merged, path=str(shown), base_dir=base_dir,
                         written=_written_tree(texts, sources, str(shown)))


def _written_tree(texts: list[str], sources: list[Source], shown: str) -> Map | None:
    """The merged tree with every `${env.NAME}` kept as written, from fresh parses (merging and loading
    change the trees they are given), or None when no file uses the environment."""
    if not any(uses_env(text) for text in texts):
        return None
    trees = []
    for text, source in zip(texts, sources, strict=True):
        tree = parse_written_text(text, source.file)
        renumber(tree, source.first_line - 1)
        trees.append(tree)
    # The real merge reported every problem already.
    return merge_trees(trees, Problems(shown, sources=tuple(sources)))
