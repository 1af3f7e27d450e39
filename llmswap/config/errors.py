"""Configuration problems: each names the file, the line and the key, and `ConfigError` carries them all.

The loader keeps going after a bad value so one run reports every mistake it can find; `Problems`
collects them (errors and warnings) and `raise_if_errors` turns the errors into one `ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One thing wrong (or worth a warning) in a config file, rendered as `file:line: key.path: message`."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        # Keys and values quoted in a message may hold control characters; one problem stays one line.
        return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class ConfigError(Exception):
    """The config cannot be used. `str(error)` lists every problem found, one per line."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.errors: tuple[str, ...] = tuple(str(p) for p in self.problems)
        super().__init__("\n".join(self.errors))


@dataclass
class Problems:
    """Errors and warnings found while loading one file."""

    file: str
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    def error(self, line: int | None, path: str, message: str) -> None:
        self.errors.append(Problem(self.file, line, path, message))

    def warn(self, line: int | None, path: str, message: str) -> None:
        self.warnings.append(Problem(self.file, line, path, message))

    def raise_if_errors(self) -> None:
        if self.errors:
            raise ConfigError(in_file_order(self.errors))


def in_file_order(problems: list[Problem]) -> list[Problem]:
    """Problems sorted by line (those without one first), so they read top to bottom like the file."""
    return sorted(problems, key=lambda problem: problem.line or 0)
