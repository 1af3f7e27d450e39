"""llama-swap's command line, accepted as it is: `-config`, `-config-dir`, `-listen`, `-watch-config`,
`-tls-cert-file`/`-tls-key-file` and `-version`, next to llmswap's own double-dash spellings."""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml

from llmswap import __version__
from llmswap.cli.args import listen_address
from llmswap.cli.main import build_parser, main
from tests.helpers.cli import WITHIN, LlmswapProcess, demo_model, running_llmswap, write_config
from tests.helpers.demo import HOST, free_port
from tests.helpers.wait import eventually


def chat(model: str) -> dict[str, object]:
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}


def write_models(path: Path, models: dict[str, dict[str, object]], **top: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**top, "models": models}, sort_keys=False))
    return path


# ---------------------------------------------------------------- parsing, in process


def test_single_dash_flags_mean_what_the_double_dash_ones_mean() -> None:
    parser = build_parser()
    go_style = parser.parse_args(["-config", "/app/config.yaml", "-config-dir", "/app/conf.d", "-listen",
                                  ":9000", "-watch-config", "-tls-cert-file", "c.pem", "-tls-key-file=k.pem",
                                  "-log-level", "debug"])
    ours = parser.parse_args(["--config=/app/config.yaml", "--config-dir", "/app/conf.d", "--listen", ":9000",
                              "--watch-config", "--tls-cert-file", "c.pem", "--tls-key-file", "k.pem",
                              "--log-level=debug"])
    assert vars(go_style) == vars(ours)
    assert (ours.config, ours.config_dir, ours.listen) == (Path("/app/config.yaml"), Path("/app/conf.d"),
                                                           ("", 9000))
    assert (ours.watch_config, ours.tls_cert_file, ours.tls_key_file) == (True, Path("c.pem"), Path("k.pem"))


def test_version_in_either_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    for spelling in ("-version", "--version"):
        with pytest.raises(SystemExit) as exit_info:
            main([spelling])
        assert exit_info.value.code == 0
        assert capsys.readouterr().out.strip() == f"llmswap {__version__}"


def test_a_misspelled_single_dash_flag_is_refused_not_split(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["-config", "x.yaml", "-watchconfig"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: -watchconfig" in capsys.readouterr().err


def test_tls_needs_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_models(tmp_path / "config.yaml", {"m": demo_model("m")})
    with pytest.raises(SystemExit) as exit_info:
        main(["-config", str(config), "-tls-cert-file", "cert.pem"])
    assert exit_info.value.code == 2
    assert "both --tls-cert-file and --tls-key-file must be given for HTTPS" in capsys.readouterr().err


def test_default_listen_is_8080_and_8443_with_tls() -> None:
    parser = build_parser()
    plain = parser.parse_args(["-config", "c.yaml"])
    tls = parser.parse_args(["-config", "c.yaml", "-tls-cert-file", "c.pem", "-tls-key-file", "k.pem"])
    chosen = parser.parse_args(["-config", "c.yaml", "-tls-cert-file", "c.pem", "-tls-key-file", "k.pem",
                                "-listen", "127.0.0.1:9443"])
    assert listen_address(plain, parser) == ("127.0.0.1", 8080)
    assert listen_address(tls, parser) == ("127.0.0.1", 8443)
    assert listen_address(chosen, parser) == ("127.0.0.1", 9443)


def test_a_certificate_that_cannot_be_read_stops_the_start(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = write_models(tmp_path / "config.yaml", {"m": demo_model("m")})
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    (tmp_path / "key.pem").write_text("not a key\n")
    argv = ["-config", str(config), "-listen", "127.0.0.1:0", "-tls-key-file", str(tmp_path / "key.pem")]
    assert main([*argv, "-tls-cert-file", str(tmp_path / "missing.pem")]) == 1
    assert f"cannot read {tmp_path / 'missing.pem'}: no such file; check --tls-cert-file" in (
        capsys.readouterr().err)
    assert main([*argv, "-tls-cert-file", str(tmp_path / "cert.pem")]) == 1
    err = capsys.readouterr().err
    assert f"cannot use the certificate {tmp_path / 'cert.pem'} with the key {tmp_path / 'key.pem'}" in err
    assert "Traceback" not in err


def test_check_config_takes_the_file_as_argument_or_as_config(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = write_models(tmp_path / "config.yaml", {"m": demo_model("m")})
    outputs = []
    for argv in (["check-config", str(config)], ["check-config", "--config", str(config)],
                 ["check-config", "-config", str(config)], ["-config", str(config), "check-config"]):
        assert main(argv) == 0
        outputs.append(capsys.readouterr().out)
    assert len(set(outputs)) == 1 and "m:" in outputs[0]
    with pytest.raises(SystemExit) as exit_info:
        main(["check-config", str(config), "--config", str(tmp_path / "other.yaml")])
    assert exit_info.value.code == 2
    assert "two config files given" in capsys.readouterr().err


def test_check_config_shows_the_merged_config_and_both_places_of_a_conflict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main_file = write_models(tmp_path / "config.yaml", {"a": demo_model("a")})
    write_models(tmp_path / "conf.d" / "b.yaml", {"b": demo_model("b")})
    assert main(["check-config", "-config", str(main_file), "-config-dir", str(tmp_path / "conf.d")]) == 0
    shown = capsys.readouterr().out
    assert "  a:" in shown and "  b:" in shown
    clash = write_models(tmp_path / "conf.d" / "c.yaml", {"a": demo_model("a")})
    assert main(["check-config", "--config-dir", str(tmp_path / "conf.d"), "--config", str(main_file)]) == 1
    assert f"{clash}:2: models.a: models entry 'a' is already defined at {main_file}:2" in (
        capsys.readouterr().err)


def test_tasks_take_the_config_before_or_after_the_action(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    tasks = {"db": str(tmp_path / "tasks.sqlite"), "types": {"letters": {"model": "m"}}}
    config = write_models(tmp_path / "config.yaml", {"m": demo_model("m")}, tasks=tasks)
    params = '{"messages": [{"role": "user", "content": "hi"}]}'
    assert main(["-config", str(config), "tasks", "submit", "letters", "--params", params]) == 0
    assert main(["tasks", "submit", "letters", "--params", params, "-config", str(config)]) == 0
    capsys.readouterr()
    assert main(["tasks", "list", "--config", str(config)]) == 0
    assert capsys.readouterr().out.count("letters") == 2


# ---------------------------------------------------------------- a real llmswap process


async def listed(http: aiohttp.ClientSession, server: LlmswapProcess) -> set[str]:
    async with http.get(f"{server.url}/v1/models") as response:
        assert response.status == 200
        return {model["id"] for model in (await response.json())["data"]}


async def test_llama_swap_command_line_serves_a_config_dir_and_watches_it(tmp_path: Path) -> None:
    main_file = write_config(tmp_path / "config.yaml", {"a": demo_model("a")})
    conf_d = tmp_path / "conf.d"
    b_file = write_models(conf_d / "b.yaml", {"b": demo_model("b")})
    port = free_port()
    argv = ("-config", str(main_file), "-config-dir", str(conf_d), "-listen", f"{HOST}:{port}",
            "-watch-config")
    async with running_llmswap(None, *argv, port=port) as server, aiohttp.ClientSession() as http:
        for model in ("a", "b"):
            async with http.post(f"{server.url}/v1/chat/completions", json=chat(model)) as response:
                assert response.status == 200, await response.text()
                assert (await response.json())["model"] == model
        assert await listed(http, server) == {"a", "b"}

        write_models(conf_d / "c.yml", {"c": demo_model("c")})

        async def has(expected: set[str]) -> bool:
            return await listed(http, server) == expected

        await eventually(lambda: has({"a", "b", "c"}), within=WITHIN, what="the added file's model")
        b_file.unlink()
        await eventually(lambda: has({"a", "c"}), within=WITHIN, what="the removed file's model to go")

        # A file that clashes is refused with both places named; the running config keeps serving.
        clash = write_models(conf_d / "d.yaml", {"a": demo_model("a")})
        await server.wait_for_output(f"{clash}:2: models.a: models entry 'a' is already defined at "
                                     f"{main_file}:", within=WITHIN)
        async with http.post(f"{server.url}/v1/chat/completions", json=chat("c")) as response:
            assert response.status == 200, await response.text()


async def test_sighup_reads_the_config_dir_again(tmp_path: Path) -> None:
    conf_d = tmp_path / "conf.d"
    write_models(conf_d / "a.yaml", {"a": demo_model("a")})
    port = free_port()
    async with (
        running_llmswap(None, "--config-dir", str(conf_d), "--listen", f"{HOST}:{port}", port=port) as server,
        aiohttp.ClientSession() as http,
    ):
        assert await listed(http, server) == {"a"}
        write_models(conf_d / "b.yaml", {"b": demo_model("b")})
        server.send_signal(signal.SIGHUP)
        await server.wait_for_output("config reload: applied", within=WITHIN)
        assert await listed(http, server) == {"a", "b"}


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={HOST}",
         "-addext", f"subjectAltName=IP:{HOST}"],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


async def test_tls_flags_serve_https_with_a_self_signed_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    config = write_models(tmp_path / "config.yaml", {"m": demo_model("m")})
    port = free_port()
    argv = ("-config", str(config), "-listen", f"{HOST}:{port}", "-tls-cert-file", str(cert),
            "-tls-key-file", str(key))
    trusted = ssl.create_default_context(cafile=str(cert))
    async with (
        running_llmswap(None, *argv, port=port, healthy=False) as server,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusted)) as http,
    ):
        line = await server.wait_for_output("listening on", within=WITHIN)
        assert f"https://{HOST}:{port}" in line
        base = f"https://{HOST}:{port}"
        async with http.post(f"{base}/v1/chat/completions", json=chat("m")) as response:
            assert response.status == 200, await response.text()
            assert "demo m says" in (await response.json())["choices"][0]["message"]["content"]
        # Plain HTTP on the TLS port gets no answer.
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"http://{HOST}:{port}/health") as response:
                await response.read()
