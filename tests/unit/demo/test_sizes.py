import pytest

from llmswap.demo.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", 1073741824),
        ("0", 0),
        ("2GB", 2_000_000_000),
        ("2gb", 2_000_000_000),
        ("512MiB", 512 * 2**20),
        ("1.5 GiB", 3 * 2**29),
        ("6.5GB", 6_500_000_000),
        ("10B", 10),
        ("3KB", 3000),
        ("3KiB", 3072),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        (" 7 MB ", 7_000_000),
    ],
)
def test_parse_size_reads_bytes_and_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "1,5GB", "two", "1 G B"])
def test_parse_size_rejects_malformed_sizes_saying_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 2GB, 512MiB"):
        parse_size(text)


def test_parse_size_names_an_unknown_unit() -> None:
    with pytest.raises(ValueError, match=r"unknown unit 'XB'"):
        parse_size("4XB")
