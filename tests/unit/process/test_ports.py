"""Which proxy URLs point at a local port the proxy must check before spawning."""

import pytest

from llmswap.process.ports import local_address


@pytest.mark.parametrize(
    ("proxy", "expected"),
    [
        ("http://127.0.0.1:5800", ("127.0.0.1", 5800)),
        ("http://localhost:5801/", ("127.0.0.1", 5801)),
        ("http://LOCALHOST:5801", ("127.0.0.1", 5801)),
        ("http://0.0.0.0:9000", ("0.0.0.0", 9000)),
        ("http://[::1]:5802", ("::1", 5802)),
        ("http://127.0.0.2:5803", ("127.0.0.2", 5803)),
        ("http://[::]:5804", ("::", 5804)),
        ("http://localhost", ("127.0.0.1", 80)),
        ("https://localhost", ("127.0.0.1", 443)),
        ("http://gpu-box.lan:5800", None),
        ("http://10.0.0.7:5800", None),
        ("", None),
    ],
)
def test_local_address(proxy: str, expected: tuple[str, int] | None) -> None:
    assert local_address(proxy) == expected
