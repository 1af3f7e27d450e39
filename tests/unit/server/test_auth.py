"""Which credential a request presents, how it is matched, which routes stay open (no event loop)."""

import base64

from multidict import CIMultiDict

from llmswap.config.model import ApiKey
from llmswap.server.http.auth import Credential, credential, find_key, is_open, without_credentials

KEYS = (ApiKey("sk-one"), ApiKey("sk-two", priority=5, max_concurrent=2))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_password_is_the_key():
    assert credential({"Authorization": basic("anyone", "sk-two")}) == Credential("basic", "sk-two")


def test_basic_password_may_contain_colons():
    assert credential({"Authorization": basic("u", "a:b:c")}) == Credential("basic", "a:b:c")


def test_bearer_scheme_is_case_insensitive():
    assert credential({"Authorization": "bearer sk-one"}) == Credential("bearer", "sk-one")
    assert credential({"Authorization": "BEARER sk-one"}) == Credential("bearer", "sk-one")


def test_x_api_key_is_used_when_there_is_no_authorization():
    assert credential({"x-api-key": "sk-one"}) == Credential("x-api-key", "sk-one")


def test_bearer_outranks_x_api_key():
    headers = {"Authorization": "Bearer wrong", "x-api-key": "sk-one"}
    assert credential(headers) == Credential("bearer", "wrong")


def test_basic_outranks_x_api_key():
    headers = {"Authorization": basic("u", "sk-two"), "x-api-key": "wrong"}
    assert credential(headers) == Credential("basic", "sk-two")


def test_undecodable_basic_is_still_the_presented_credential():
    headers = {"Authorization": "Basic !!!not-base64", "x-api-key": "sk-one"}
    assert credential(headers) == Credential("basic", "")


def test_basic_without_a_colon_presents_no_password():
    token = base64.b64encode(b"just-a-user").decode()
    assert credential({"Authorization": f"Basic {token}"}) == Credential("basic", "")


def test_unknown_authorization_scheme_falls_through_to_x_api_key():
    headers = {"Authorization": "Token abc", "x-api-key": "sk-one"}
    assert credential(headers) == Credential("x-api-key", "sk-one")


def test_no_credential_at_all():
    assert credential({}) is None
    assert credential({"Authorization": "Token abc"}) is None


def test_find_key_returns_the_matching_entry():
    assert find_key("sk-two", KEYS) == KEYS[1]
    assert find_key("sk-one", KEYS) == KEYS[0]


def test_find_key_rejects_near_misses_and_empty():
    assert find_key("sk-on", KEYS) is None
    assert find_key("sk-one ", KEYS) is None
    assert find_key("", (*KEYS, ApiKey(""))) is None


def test_find_key_handles_non_ascii_candidates():
    assert find_key("clé-secrète", KEYS) is None
    assert find_key("clé-secrète", (ApiKey("clé-secrète"),)) == ApiKey("clé-secrète")


def test_health_root_favicon_and_preflight_are_open():
    for path in ("/health", "/wol-health", "/", "/favicon.ico"):
        assert is_open("GET", path), path
    assert is_open("OPTIONS", "/v1/chat/completions")


def test_ui_page_is_open_but_not_look_alikes():
    assert is_open("GET", "/ui")
    assert is_open("GET", "/ui/models")
    assert not is_open("GET", "/uix")


def test_only_get_of_bare_upstream_is_open():
    assert is_open("GET", "/upstream")
    assert is_open("HEAD", "/upstream")
    assert not is_open("POST", "/upstream")
    assert not is_open("GET", "/upstream/m/")


def test_api_routes_need_a_key():
    for path in ("/v1/models", "/running", "/unload", "/logs", "/logs/stream", "/api/events",
                 "/v1/chat/completions", "/api/version"):
        assert not is_open("GET", path), path


def test_credentials_are_removed_before_forwarding():
    headers = CIMultiDict({"Authorization": "Bearer sk-one", "X-API-Key": "sk-one", "Accept": "text/plain"})
    kept = without_credentials(headers)
    assert dict(kept) == {"Accept": "text/plain"}
    assert "Authorization" in headers  # the original is untouched
