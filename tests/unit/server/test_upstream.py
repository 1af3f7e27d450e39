"""Which model an `/upstream/...` path addresses, and which paths `ignorePaths` covers (no event loop)."""

from llmswap.config.model import DEFAULT_UPSTREAM_IGNORE_PATHS, Config, ModelConfig, PeerConfig
from llmswap.server.inference.passthrough import UpstreamTarget, find_target, ignored


def model(model_id: str) -> ModelConfig:
    return ModelConfig(id=model_id, cmd=("serve",), proxy="http://127.0.0.1:1")


CONFIG = Config(
    models={m: model(m) for m in ("qwen", "org", "org/model", "name with space")},
    aliases={"q": "qwen"},
    peers={
        "cloud": PeerConfig("cloud", "https://cloud", models=("gpt", "meta/llama", "shared")),
        "other": PeerConfig("other", "https://other", models=("shared", "solo")),
    },
)


def test_model_then_path():
    assert find_target(CONFIG, "qwen/props") == UpstreamTarget("qwen", "qwen", None, "/props")


def test_alias_resolves_to_the_real_id_but_keeps_its_spelling():
    assert find_target(CONFIG, "q/v1/models") == UpstreamTarget("q", "qwen", None, "/v1/models")


def test_trailing_slash_forwards_root_and_bare_name_asks_for_redirect():
    assert find_target(CONFIG, "qwen/") == UpstreamTarget("qwen", "qwen", None, "/")
    assert find_target(CONFIG, "qwen") == UpstreamTarget("qwen", "qwen", None, "")


def test_longest_prefix_wins_for_names_with_slashes():
    target = find_target(CONFIG, "org/model/health")
    assert target == UpstreamTarget("org/model", "org/model", None, "/health")
    assert find_target(CONFIG, "org/other") == UpstreamTarget("org", "org", None, "/other")


def test_escaping_is_kept_in_the_forwarded_path_and_decoded_for_the_name():
    target = find_target(CONFIG, "name%20with%20space/a%2Fb/c%20d")
    assert target == UpstreamTarget("name%20with%20space", "name with space", None, "/a%2Fb/c%20d")


def test_peer_models_qualified_and_unique_bare_names():
    assert find_target(CONFIG, "cloud/meta/llama/v1/x") == UpstreamTarget("cloud/meta/llama", "meta/llama",
                                                                          "cloud", "/v1/x")
    assert find_target(CONFIG, "solo/") == UpstreamTarget("solo", "solo", "other", "/")


def test_bare_name_listed_by_two_peers_is_ambiguous():
    assert find_target(CONFIG, "other/shared/") == UpstreamTarget("other/shared", "shared", "other", "/")
    assert find_target(CONFIG, "shared/x") is None


def test_unknown_model_and_empty_path():
    assert find_target(CONFIG, "nope/props") is None
    assert find_target(CONFIG, "") is None


def test_default_ignore_paths_cover_static_assets_only():
    for path in ("/index.js", "/app.css", "/favicon.ico", "/x/y.json", "/logo.PNG".lower()):
        assert ignored(path, DEFAULT_UPSTREAM_IGNORE_PATHS), path
    for path in ("/", "/props", "/v1/chat/completions", "/json/x"):
        assert not ignored(path, DEFAULT_UPSTREAM_IGNORE_PATHS), path


def test_ignore_patterns_match_anywhere():
    assert ignored("/api/metrics", (r"metrics",))
    assert not ignored("/api/props", (r"^/metrics",))
