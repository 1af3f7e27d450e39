"""When a try that broke before any answer may be sent again: Go's transport's rule."""

from __future__ import annotations

from llmswap.dispatch.pool import Attempt, may_resend


def test_a_fresh_connection_that_broke_is_never_resent() -> None:
    for method in ("GET", "POST"):
        assert not may_resend(method, {}, Attempt(reused=False, handed_over=False))
        assert not may_resend(method, {}, Attempt(reused=False, handed_over=True))


def test_a_pooled_connection_that_broke_before_the_request_was_handed_over_is_resent() -> None:
    assert may_resend("POST", {}, Attempt(reused=True, handed_over=False))


def test_a_request_written_to_a_pooled_connection_is_resent_only_when_idempotent() -> None:
    written = Attempt(reused=True, handed_over=True)
    assert not may_resend("POST", {}, written)
    assert not may_resend("PATCH", {}, written)
    assert may_resend("GET", {}, written) and may_resend("delete", {}, written)
    assert may_resend("POST", {"Idempotency-Key": "k1"}, written)
