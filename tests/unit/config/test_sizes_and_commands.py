"""parse_size and the cmd splitter: pure functions."""

from __future__ import annotations

import pytest

from llmswap.config import parse_size
from llmswap.config.commands import split_command, strip_comment_lines


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6.5GB", 6_500_000_000),
        ("6500MiB", 6500 * 1024**2),
        ("512MB", 512_000_000),
        ("6.5", 6_500_000_000),
        ("24", 24_000_000_000),
        (24, 24_000_000_000),
        (6.5, 6_500_000_000),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("2TB", 2 * 1000**4),
        ("1TiB", 1024**4),
        ("2GiB", 2 * 1024**3),
        ("300B", 300),
        ("  8 gb ", 8_000_000_000),
        ("1.5gib", 3 * 1024**3 // 2),
        (".5GB", 500_000_000),
        ("0", 0),
    ],
)
def test_parse_size_units(text: str | int | float, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_default_unit_can_be_bytes() -> None:
    assert parse_size("1048576", default_unit="B") == 1048576
    assert parse_size(4096, default_unit="B") == 4096
    assert parse_size("1MiB", default_unit="B") == 1024**2


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "6.5 gigabytes", "1e3", "12K", "1,5GB", "abc", True, -2])
def test_parse_size_rejects_with_the_accepted_forms(text: str | int | bool) -> None:
    with pytest.raises(ValueError) as caught:
        parse_size(text)
    message = str(caught.value)
    assert repr(text) in message
    assert "6.5GB" in message or "non-negative" in message


def test_parse_size_unknown_unit_names_the_unit() -> None:
    with pytest.raises(ValueError, match=r"unknown unit 'K' in '12K'"):
        parse_size("12K")


def test_strip_comment_lines_drops_only_lines_starting_with_hash() -> None:
    text = "server \\\n  # a comment\n  --flag '#not-a-comment' # trailing\n#last"
    assert strip_comment_lines(text) == "server \\\n  --flag '#not-a-comment' # trailing"


def test_split_command_joins_continuations_and_keeps_quotes_together() -> None:
    text = "/bin/server \\\n  --model '/models/my model.gguf' \\\n  --name \"a b\"\n--escaped a\\ b"
    assert split_command(text) == (
        "/bin/server",
        "--model",
        "/models/my model.gguf",
        "--name",
        "a b",
        "--escaped",
        "a b",
    )


def test_split_command_ignores_comment_lines_inside_a_continued_command() -> None:
    text = "server \\\n# --disabled \\\n  --enabled"
    assert split_command(text) == ("server", "--enabled")


def test_split_command_keeps_hash_inside_words_and_dollar_literally() -> None:
    assert split_command("echo a#b $HOME ${PID}") == ("echo", "a#b", "$HOME", "${PID}")


def test_split_command_unclosed_quote_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="No closing quotation"):
        split_command("server 'unclosed")


def test_split_command_of_only_comments_is_empty() -> None:
    assert split_command("# nothing\n   # here\n") == ()
