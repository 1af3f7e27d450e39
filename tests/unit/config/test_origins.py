"""`cors.allowedOrigins` and `allowedHosts`: the patterns, their matching, and the errors naming file:line."""

from __future__ import annotations

import pytest

from llmswap.config.origins import (
    ANY_PORT,
    Origin,
    OriginPattern,
    is_loopback_host,
    parse_host_pattern,
    parse_origin,
    parse_origin_pattern,
    split_host_port,
)

from .support import errors_of, load


def test_an_origin_header_is_parsed_with_its_default_port():
    assert parse_origin("HTTPS://Chat.Example.com") == Origin("https", "chat.example.com", 443)
    assert parse_origin("http://[::1]:8080") == Origin("http", "::1", 8080)
    assert parse_origin("chrome-extension://abcdef") == Origin("chrome-extension", "abcdef", None)


@pytest.mark.parametrize("value", ["null", "", "example.com", "http://", "http://a b", "http://a:99999",
                                   "http://a:1/path", "http://[::1", "http://x@y"])
def test_what_is_not_an_origin_parses_to_none(value):
    assert parse_origin(value) is None


def test_host_and_port_are_split_for_names_and_addresses():
    assert split_host_port("LocalHost:8080") == ("localhost", 8080)
    assert split_host_port("[::1]") == ("::1", None)
    assert split_host_port("10.0.0.1:80") == ("10.0.0.1", 80)
    assert split_host_port("[nope]:80") is None
    assert split_host_port("a:b") is None
    assert split_host_port("localhost.:80") == ("localhost", 80)


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("a.b.localhost", True), ("127.0.0.1", True), ("127.255.0.9", True), ("::1", True),
    ("::ffff:127.0.0.1", True), ("localhost.evil.test", False), ("128.0.0.1", False), ("0.0.0.0", False),
    ("evil.test", False),
])
def test_loopback_hosts(host, loopback):
    assert is_loopback_host(host) is loopback


def test_origin_patterns_parse_their_host_and_port():
    assert parse_origin_pattern("https://chat.example.com") == OriginPattern(
        "https://chat.example.com", "https", "chat.example.com", 443)
    assert parse_origin_pattern("https://*.example.com").host == "*.example.com"
    assert parse_origin_pattern("http://localhost:*").port == ANY_PORT
    assert parse_origin_pattern(" * ").any_origin


def test_a_wildcard_needs_at_least_one_label():
    pattern = parse_origin_pattern("https://*.example.com")
    assert pattern.matches(parse_origin("https://a.example.com"))
    assert pattern.matches(parse_origin("https://a.b.example.com"))
    assert not pattern.matches(parse_origin("https://example.com"))
    assert not pattern.matches(parse_origin("https://badexample.com"))
    assert not pattern.matches(None)


@pytest.mark.parametrize(("text", "message"), [
    ("chat.example.com", "'chat.example.com' is not an origin; write scheme://host[:port]"),
    ("https://chat.example.com/", "an origin has no path; write https://chat.example.com"),
    ("https://chat.example.com/app", "an origin has no path; write https://chat.example.com"),
    ("https://me@chat.example.com", "an origin has no user name; write https://chat.example.com"),
    ("https://a.*.com", "a * may stand only for the whole host"),
    ("https://chat*.example.com", "a * may stand only for the whole host"),
    ("null", "use * to allow every origin"),
])
def test_a_bad_origin_pattern_says_what_to_write(text, message):
    with pytest.raises(ValueError) as caught:
        parse_origin_pattern(text)
    assert message in str(caught.value)


@pytest.mark.parametrize(("text", "message"), [
    ("http://llm.lan", "without scheme or path, e.g. llm.lan"),
    ("llm.lan:8080", "leave the port out (any port is allowed); write llm.lan"),
    ("llm lan", "is not a host name"),
])
def test_a_bad_host_pattern_says_what_to_write(text, message):
    with pytest.raises(ValueError) as caught:
        parse_host_pattern(text)
    assert message in str(caught.value)


def test_the_settings_load_into_the_config():
    config = load("""\
        cors:
          allowedOrigins:
            - https://chat.example.com
            - http://localhost:*
        allowedHosts: [llm.lan, "*.example.com"]
        """)
    assert [p.text for p in config.allowed_origins] == ["https://chat.example.com", "http://localhost:*"]
    assert [p.host for p in config.allowed_hosts] == ["llm.lan", "*.example.com"]
    assert config.warnings == ()


def test_no_settings_mean_loopback_only():
    config = load("")
    assert (config.allowed_origins, config.allowed_hosts) == ((), ())


def test_each_bad_entry_is_named_with_its_line():
    assert errors_of("""\
        cors:
          allowedOrigins:
            - https://ok.example.com
            - chat.example.com
        allowedHosts:
          - http://llm.lan/
        """) == [
        "config.yaml:4: cors.allowedOrigins[1]: 'chat.example.com' is not an origin; write "
        "scheme://host[:port], e.g. https://chat.example.com, https://*.example.com or http://localhost:*",
        "config.yaml:6: allowedHosts[0]: 'http://llm.lan/': give the host name alone, without scheme or "
        "path, e.g. llm.lan",
    ]


def test_wrong_shapes_are_errors_and_unknown_keys_warnings():
    assert errors_of("cors: [https://a.example]\n") == [
        "config.yaml:1: cors: must be a mapping with allowedOrigins:, got a list"]
    assert errors_of("allowedHosts: llm.lan\n") == [
        "config.yaml:1: allowedHosts: must be a list of host names such as llm.example.com, got \"llm.lan\""]
    config = load("cors: {allowedOrigin: ['*']}\n")
    assert config.warnings == (
        "config.yaml:1: cors.allowedOrigin: unknown key, ignored; did you mean 'allowedOrigins'?",)


def test_star_among_other_origins_is_warned_about():
    config = load("cors: {allowedOrigins: ['*', 'https://a.example']}\n")
    assert config.warnings == ("config.yaml:1: cors.allowedOrigins: * allows every origin; the other entries "
                               "change nothing",)
