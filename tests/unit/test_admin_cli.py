"""The admin commands' pure parts: which models `ps` shows and how its table reads, URL checking."""

from __future__ import annotations

import pytest

from llmswap.cli.admin import AdminError, Client, model_path, rows, table
from llmswap.cli.main import build_parser


def model(model_id: str, state: str, in_flight: int = 0, waiting: int = 0, **extra) -> dict:
    return {"id": model_id, "state": state, "in_flight": in_flight, "waiting": waiting, "pid": None,
            "last_start_seconds": None, "extras": {}, **extra}


SNAPSHOT = {"router": "vram", "models": [
    model("chat", "ready", in_flight=2, pid=4242, last_start_seconds=1.5,
          extras={"vram": {"footprint": 6 * 2**30, "footprint_human": "6.0 GiB"}}),
    model("coder", "stopped", waiting=3),
    model("embed", "stopped"),
]}


def test_ps_shows_running_models_and_models_with_queued_requests_unless_asked_for_all():
    assert [row.model for row in rows(SNAPSHOT, show_all=False)] == ["chat", "coder"]
    assert [row.model for row in rows(SNAPSHOT, show_all=True)] == ["chat", "coder", "embed"]


def test_the_ps_table_has_aligned_columns_with_footprint_counts_and_pid():
    text = table(rows(SNAPSHOT, show_all=False))
    assert text.splitlines() == [
        "MODEL   STATE     FOOTPRINT   IN FLIGHT   QUEUED   PID    LAST START",
        "chat    ready     6.0 GiB     2           0        4242   1.50s",
        "coder   stopped   -           0           3        -      -",
    ]


def test_a_url_must_be_http_and_model_names_keep_their_slashes():
    with pytest.raises(AdminError, match="not an http:// or https:// address"):
        Client("ftp://127.0.0.1:8080")
    assert Client("http://127.0.0.1:8080/").url == "http://127.0.0.1:8080"
    assert model_path("load", "org/model name") == "/api/models/load/org/model%20name"


def test_the_url_takes_host_and_port_as_listen_does() -> None:
    assert Client("127.0.0.1:8080").url == "http://127.0.0.1:8080"
    assert Client(":9000").url == "http://127.0.0.1:9000"
    assert Client("[::1]:8080").url == "http://[::1]:8080"
    with pytest.raises(AdminError, match="neither a URL nor HOST:PORT"):
        Client("llmswap")


def test_llmswap_url_in_the_environment_is_the_default_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSWAP_URL", "127.0.0.1:9090")
    assert build_parser().parse_args(["ps"]).url == "127.0.0.1:9090"
    assert build_parser().parse_args(["load", "m", "--url", ":8081"]).url == ":8081"  # the flag wins
    monkeypatch.delenv("LLMSWAP_URL")
    assert build_parser().parse_args(["unload"]).url == "http://127.0.0.1:8080"


def test_every_admin_and_task_flag_takes_one_dash_as_with_two() -> None:
    parser = build_parser()
    args = parser.parse_args(["ps", "-all", "-json", "-url", "127.0.0.1:8081"])
    assert (args.all, args.json, args.url) == (True, True, "127.0.0.1:8081")
    assert parser.parse_args(["ps", "-a"]).all
    listing = parser.parse_args(["tasks", "list", "-limit", "3", "-status", "queued", "-config", "c.yaml"])
    assert (listing.limit, listing.status, str(listing.config)) == (3, "queued", "c.yaml")
    submit = parser.parse_args(["tasks", "submit", "t", "-params", "{}", "-job-id", "7"])
    assert (submit.params, submit.job_id) == ("{}", 7)
