"""The guard's decisions from method, path and headers alone (no event loop): Host, Origin, cross-site
requests without an Origin, and the CORS preflight answer."""

from __future__ import annotations

import pytest

from llmswap.config.model import ApiKey, Config
from llmswap.config.origins import parse_host_pattern, parse_origin_pattern
from llmswap.server.http.guard import (
    DEFAULT_ALLOW_HEADERS,
    Screening,
    is_loopback_listener,
    judge,
    preflight_headers,
    sanitize_header_names,
)

LOCAL = "127.0.0.1:8080"


def config(origins: tuple[str, ...] = (), hosts: tuple[str, ...] = ()) -> Config:
    return Config(allowed_origins=tuple(parse_origin_pattern(o) for o in origins),
                  allowed_hosts=tuple(parse_host_pattern(h) for h in hosts))


def verdict(method: str = "POST", path: str = "/v1/chat/completions", *, loopback: bool = True,
            settings: Config | None = None, **headers: str) -> Screening:
    sent = {"Host": LOCAL, **{name.replace("_", "-"): value for name, value in headers.items()}}
    return judge(method, path, sent, settings or config(), loopback_listener=loopback)


def test_an_sdk_request_without_origin_or_fetch_headers_passes_untouched():
    assert verdict() == Screening()
    assert verdict("GET", "/unload") == Screening()


@pytest.mark.parametrize("origin", [
    "http://localhost:3000", "https://localhost", "http://127.0.0.1:5173", "http://127.9.9.9",
    "http://[::1]:8080", "http://app.localhost:3000",
])
def test_loopback_origins_are_allowed_and_echoed(origin):
    assert verdict(Origin=origin) == Screening(allow_origin=origin)


def test_the_servers_own_origin_is_allowed_on_a_public_listener():
    seen = verdict(Origin="http://192.168.1.5:8080", Host="192.168.1.5:8080", loopback=False)
    assert seen == Screening(allow_origin="http://192.168.1.5:8080")
    assert verdict(Origin="http://llm.lan", Host="llm.lan:80", loopback=False).allow_origin == "http://llm.lan"


@pytest.mark.parametrize("origin", [
    "http://evil.test", "https://localhost.evil.test", "http://127.0.0.1.evil.test", "null",
    "file://", "http://192.168.1.5:9999", "not an origin",
])
def test_a_foreign_origin_is_refused_even_for_a_simple_request(origin):
    seen = verdict(Origin=origin, Host="192.168.1.5:8080", loopback=False)
    assert seen.refused
    assert "add it to cors.allowedOrigins" in seen.refusal


def test_a_refused_preflight_is_refused_before_it_is_answered():
    assert verdict("OPTIONS", Origin="http://evil.test", Access_Control_Request_Method="POST").refused


def test_configured_origins_are_allowed():
    settings = config(origins=("https://chat.example.com", "https://*.corp.example", "http://tool.test:*"))
    for origin in ("https://chat.example.com", "https://chat.example.com:443", "https://a.b.corp.example",
                   "http://tool.test:1234"):
        assert verdict(Origin=origin, settings=settings).allow_origin == origin, origin
    for origin in ("http://chat.example.com", "https://chat.example.com:8443", "https://corp.example",
                   "https://evilcorp.example", "https://tool.test:1234"):
        assert verdict(Origin=origin, settings=settings).refused, origin


def test_star_allows_every_origin_and_the_null_one():
    settings = config(origins=("*",))
    assert verdict(Origin="https://anything.example", settings=settings).allow_origin == "https://anything.example"
    assert verdict(Origin="null", settings=settings).allow_origin == "null"
    assert verdict("GET", "/unload", settings=settings, Sec_Fetch_Site="cross-site") == Screening()


def test_a_cross_site_request_without_origin_may_not_change_state():
    for method, path in (("GET", "/unload"), ("POST", "/api/models/unload"), ("GET", "/upstream/m/props"),
                         ("GET", "/v1/models"), ("GET", "/logs")):
        seen = verdict(method, path, Sec_Fetch_Site="cross-site", Sec_Fetch_Mode="no-cors")
        assert seen.refused and "another site may not drive llmswap" in seen.refusal, (method, path)


def test_a_cross_site_link_may_still_open_the_status_page():
    for path in ("/", "/ui", "/ui/app.js", "/health"):
        assert verdict("GET", path, Sec_Fetch_Site="cross-site", Sec_Fetch_Mode="navigate") == Screening()


def test_same_origin_and_typed_in_requests_without_origin_pass():
    for site in ("same-origin", "same-site", "none"):
        assert verdict("GET", "/unload", Sec_Fetch_Site=site) == Screening()


@pytest.mark.parametrize("host", ["localhost:8080", "localhost", "127.0.0.1", "127.3.2.1:1", "[::1]:8080",
                                  "app.localhost:8080", "LOCALHOST:8080"])
def test_loopback_hosts_are_answered_on_a_loopback_listener(host):
    assert verdict(Host=host) == Screening()


@pytest.mark.parametrize("host", ["evil.test:8080", "192.168.1.5:8080", "localhost.evil.test",
                                  "127.0.0.1.nip.io:8080", "bad host", "[::1"])
def test_a_foreign_host_is_refused_on_a_loopback_listener(host):
    seen = verdict(Host=host)
    assert seen.refused and "add the name to allowedHosts" in seen.refusal


def test_a_foreign_host_is_refused_even_with_an_allowed_origin():
    assert verdict(Host="evil.test:8080", Origin="http://evil.test:8080").refused


def test_configured_hosts_are_answered():
    settings = config(hosts=("llm.lan", "*.example.com"))
    for host in ("llm.lan:8080", "a.example.com", "b.c.example.com:1"):
        assert verdict(Host=host, settings=settings) == Screening(), host
    for host in ("example.com", "llm.lan.evil.test"):
        assert verdict(Host=host, settings=settings).refused, host


def test_a_public_listener_answers_any_host_unless_hosts_are_configured():
    assert verdict(Host="anything.test:8080", loopback=False) == Screening()
    settings = config(hosts=("llm.lan",))
    assert verdict(Host="anything.test:8080", loopback=False, settings=settings).refusal == (
        "the Host anything.test:8080 is not allowed; add it to allowedHosts in the config to allow it")
    assert verdict(Host="localhost:8080", loopback=False, settings=settings) == Screening()


def test_no_host_header_is_not_a_browser_and_passes():
    assert judge("GET", "/running", {}, config(), loopback_listener=True) == Screening()


def test_preflight_from_an_allowed_origin_echoes_it_and_the_requested_headers():
    headers = preflight_headers({"Access-Control-Request-Headers": "content-type, x-api-key"},
                                "http://localhost:3000")
    assert headers == {
        "Access-Control-Allow-Origin": "http://localhost:3000",
        "Vary": "Origin",
        "Access-Control-Allow-Methods": "GET, POST, PUT, PATCH, DELETE, OPTIONS",
        "Access-Control-Allow-Headers": "content-type, x-api-key",
        "Access-Control-Max-Age": "86400",
    }


def test_preflight_answers_chromiums_private_network_question_for_an_allowed_origin():
    asked = {"Access-Control-Request-Private-Network": "true"}
    answer = preflight_headers(asked, "https://chat.example.com")
    assert answer["Access-Control-Allow-Private-Network"] == "true"
    assert "Access-Control-Allow-Private-Network" not in preflight_headers(asked, "")


def test_an_options_request_from_no_page_gets_no_allowed_origin():
    assert "Access-Control-Allow-Origin" not in preflight_headers({}, "")
    assert preflight_headers({}, "")["Access-Control-Allow-Headers"] == DEFAULT_ALLOW_HEADERS


def test_header_names_that_are_not_tokens_are_not_echoed():
    assert sanitize_header_names("x-ok, bad header, x\"quote, ,Authorization") == "x-ok, Authorization"
    assert sanitize_header_names("evil\r\nSet-Cookie: a=b") == ""
    answer = preflight_headers({"Access-Control-Request-Headers": "a b"}, "")
    assert answer["Access-Control-Allow-Headers"] == DEFAULT_ALLOW_HEADERS


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True), ("127.0.0.2", True),
    ("", False), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False),
])
def test_which_listen_addresses_are_loopback(host, loopback):
    assert is_loopback_listener(host) is loopback


def test_a_host_verdict_remembered_for_one_config_does_not_decide_for_another():
    # The Host check is worked out once per (Host, allowedHosts, listener): each part must count.
    assert verdict(Host="llm.example:8080").refused
    assert not verdict(Host="llm.example:8080", settings=config(hosts=("llm.example",))).refused
    assert verdict(Host="llm.example:8080").refused
    assert not verdict(Host="llm.example:8080", loopback=False).refused
    assert verdict(Host="other.example", loopback=False, settings=config(hosts=("llm.example",))).refused


def test_a_cross_site_request_is_refused_unless_any_origin_is_allowed():
    assert verdict("POST", "/unload", Sec_Fetch_Site="cross-site").refused
    assert not verdict("POST", "/unload", Sec_Fetch_Site="same-origin").refused
    anyone = config(origins=("*",))
    assert not verdict("POST", "/unload", Sec_Fetch_Site=" Cross-Site ", settings=anyone).refused


def test_with_api_keys_any_page_may_call_and_the_key_guards_it():
    keyed = Config(api_keys=(ApiKey(key="sk-1"),))
    foreign = "https://chat.example.com"
    assert verdict(settings=keyed, Origin=foreign) == Screening(allow_origin=foreign)
    assert verdict(settings=config(), Origin=foreign).refused  # without keys: loopback and its own only
    allowed = verdict("OPTIONS", settings=keyed, Origin=foreign).allow_origin
    answer = preflight_headers({"Origin": foreign}, allowed)
    assert answer["Access-Control-Allow-Origin"] == foreign


def test_with_api_keys_allowed_origins_still_restrict_the_pages():
    keyed = Config(api_keys=(ApiKey(key="sk-1"),),
                   allowed_origins=(parse_origin_pattern("https://app.example.com"),))
    assert verdict(settings=keyed, Origin="https://app.example.com").allow_origin == "https://app.example.com"
    assert verdict(settings=keyed, Origin="https://chat.example.com").refused
    # Without an Origin, a cross-site page is held to the status page as before: keys change only origins.
    assert verdict(settings=keyed, Sec_Fetch_Site="cross-site").refused
