"""Configuration problems: each names the file, the line and the key, and `ConfigError` carries them all.

The loader keeps going after a bad value so one run reports every mistake it can find; `Problems`
collects them (errors and warnings) and `raise_if_errors` turns the errors into one `ConfigError`.

A config merged from several files (`-config-dir`) numbers its lines across them: the second file's
line 1 comes after the first file's last line. `Problems` with `sources` turns such a line back into
the file and line the user wrote, so every reader of the tree stays unaware of the merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Problem:
    """One thing wrong (or worth a warning) in a config file, rendered as `file:line: key.path: message`."""

    file: str
    line: int | None
    path: str
    message: str
    order: int | None = field(default=None, compare=False)  # position across merged files, for sorting
    warning: bool = field(default=False, compare=False)  # a warning (listed with errors when it explains one)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        # Keys and values quoted in a message may hold control characters; one problem stays one line.
        return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class ConfigError(Exception):
    """The config cannot be used. `str(error)` lists every problem found, one per line."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        # A warning listed among the errors (a hint that explains one) says it is one, as it does alone.
        self.errors: tuple[str, ...] = tuple(f"{'warning: ' if p.warning else ''}{p}" for p in self.problems)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True)
class Source:
    """One file of a merged config: its lines are numbered from `first_line` in the merged tree."""

    file: str
    first_line: int


@dataclass
class Problems:
    """Errors and warnings found while loading one file (or several merged ones, see `sources`)."""

    file: str
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    sources: tuple[Source, ...] = ()  # ascending first_line; empty for a single file

    def error(self, line: int | None, path: str, message: str) -> None:
        self.errors.append(self._problem(line, path, message))

    def warn(self, line: int | None, path: str, message: str) -> None:
        self.warnings.append(replace(self._problem(line, path, message), warning=True))

    def locate(self, line: int) -> tuple[str, int]:
        """The file and line the user wrote for a line of the (possibly merged) tree."""
        for source in reversed(self.sources):
            if line >= source.first_line:
                return source.file, line - source.first_line + 1
        return self.file, line

    def where(self, line: int) -> str:
        """A line for a message about another place: `line 12`, or `other.yaml:12` once files are merged."""
        if not self.sources:
            return f"line {line}"
        file, number = self.locate(line)
        return f"{file}:{number}"

    def _problem(self, line: int | None, path: str, message: str) -> Problem:
        if not line or not self.sources:
            return Problem(self.file, line, path, message)
        file, number = self.locate(line)
        return Problem(file, number, path, message, order=line)

    def raise_if_errors(self) -> None:
        """Raise the errors; a warning with a hint (`did you mean ...?`) goes with them, since the key it
        names is often the reason for an error (`cmd: is required` beside `comand: unknown key`)."""
        if self.errors:
            hints = [w for w in self.warnings if HINT in w.message]
            raise ConfigError(in_file_order([*self.errors, *hints]))


HINT = "did you mean"  # how a warning that may explain an error says so


def in_file_order(problems: list[Problem]) -> list[Problem]:
    """Problems sorted by line (those without one first), so they read top to bottom like the file."""
    return sorted(problems, key=_position)


def _position(problem: Problem) -> int:
    return problem.order if problem.order is not None else problem.line or 0
