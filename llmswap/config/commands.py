"""`cmd` / `cmdStop` text -> argv, the way llama-swap reads a command: never through a shell.

A command may span lines: lines whose first non-blank character is `#` are comments and dropped,
a line ending in `\\` continues on the next one, and the rest is split like a POSIX shell splits
words (quotes group, backslashes escape). Nothing is expanded: no globs, no `$VAR`, no pipes.
"""

from __future__ import annotations

import shlex


def strip_comment_lines(text: str) -> str:
    """`text` without the lines whose trimmed text starts with `#`."""
    return "\n".join(line for line in text.split("\n") if not line.strip().startswith("#"))


def split_command(text: str) -> tuple[str, ...]:
    """The argv of a command line. Raises ValueError (with shlex's reason) on an unclosed quote."""
    joined = []
    for line in strip_comment_lines(text).split("\n"):
        trimmed = line.strip()
        # shlex would keep a backslash-newline as a literal newline inside the word.
        joined.append(trimmed[:-1] + " " if trimmed.endswith("\\") else line)
    return tuple(shlex.split("\n".join(joined), comments=False, posix=True))
