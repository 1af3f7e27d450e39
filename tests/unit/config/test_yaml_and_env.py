"""Reading the file: YAML errors with lines, duplicate keys, anchors, `${env.NAME}`, ConfigError's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmswap.config import ConfigError, load_config, load_config_text

from .support import errors_of, load, one_error


def test_invalid_yaml_reports_its_line_and_problem() -> None:
    error = one_error("""\
        models:
          qwen:
            cmd: "unclosed
        """)
    assert error.startswith("config.yaml:3: invalid YAML: ")


def test_invalid_yaml_in_a_flow_mapping_names_the_line() -> None:
    error = one_error("a: 1\nb: {c: 2\nd: 3\n")
    assert error.startswith("config.yaml:")
    assert "invalid YAML" in error


def test_control_character_is_an_error_with_its_line() -> None:
    error = one_error("a: 1\nb: \x07\n")
    assert error.startswith("config.yaml:2: invalid YAML: unacceptable character #x0007")


def test_duplicate_keys_name_both_lines() -> None:
    error = one_error("""\
        models:
          qwen:
            cmd: a --port ${PORT}
            ttl: 5
            ttl: 6
        """)
    assert error == "config.yaml:5: models.qwen.ttl: duplicate key (first at line 4); keep only one of them"


def test_duplicate_model_ids_are_an_error() -> None:
    errors = errors_of("""\
        models:
          qwen:
            cmd: a --port ${PORT}
          qwen:
            cmd: b --port ${PORT}
        """)
    assert errors == ["config.yaml:4: models.qwen: duplicate key (first at line 2); keep only one of them"]


def test_top_level_must_be_a_mapping() -> None:
    error = one_error("- a\n- b\n")
    assert (
        error
        == "config.yaml:1: the top level must be a mapping of settings (models:, macros:, ...), got a list"
    )


def test_empty_file_is_a_config_without_models() -> None:
    config = load("")
    assert dict(config.models) == {}
    assert config.routing.router.groups["(default)"].members == ()


def test_comment_only_file_loads() -> None:
    assert dict(load("# nothing yet\n").models) == {}


def test_merge_keys_and_anchors_expand_and_explicit_keys_win() -> None:
    config = load("""\
        x-base: &base
          cmd: server --port ${PORT} --model ${MODEL_ID}
          ttl: 30
        models:
          a:
            <<: *base
          b:
            <<: *base
            ttl: 60
        """)
    assert config.models["a"].cmd == ("server", "--port", "5800", "--model", "a")
    assert config.models["b"].cmd == ("server", "--port", "5801", "--model", "b")
    assert (config.models["a"].ttl, config.models["b"].ttl) == (30, 60)
    assert config.warnings == ("config.yaml:1: x-base: unknown key, ignored",)


def test_alias_loop_is_an_error_not_a_hang() -> None:
    error = one_error("a: &loop [1, *loop]\n")
    assert "alias refers to a value that contains it" in error
    assert error.startswith("config.yaml:1: a[1]:")


def test_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 8):
        previous = f"*a{level - 1}"
        lines.append(f"a{level}: &a{level} [{', '.join([previous] * 10)}]")
    error = one_error("\n".join(lines) + "\n")
    assert "more than 100000 values" in error


def test_deep_nesting_is_an_error() -> None:
    error = one_error("a: " + "[" * 150 + "]" * 150 + "\n")
    assert "nested" in error


def test_yaml_core_schema_keeps_words_as_text() -> None:
    config = load("""\
        models:
          m:
            cmd: srv --port ${PORT}
            name: on
            description: 1.10
            metadata:
              flag: yes
              version: 1.10
              real: true
              count: 0x10
        """)
    model = config.models["m"]
    assert (model.name, model.description) == ("on", "1.10")
    assert model.metadata == {"flag": "yes", "version": 1.1, "real": True, "count": 16}


def test_env_substitution_replaces_values_and_skips_comments() -> None:
    config = load(
        """\
        # ${env.NOT_SET} in a comment is ignored
        models:
          m:
            cmd: ${env.SERVER} --port ${PORT}   # ${env.ALSO_NOT_SET}
            name: "${env.QUOTED}"
            description: '${env.SINGLE}'
        """,
        {"SERVER": "/opt/server", "QUOTED": 'say "hi" \\o/', "SINGLE": "it's"},
    )
    model = config.models["m"]
    assert model.cmd == ("/opt/server", "--port", "5800")
    assert model.name == 'say "hi" \\o/'
    assert model.description == "it's"


def test_unset_env_variable_is_an_error_naming_it_and_its_line() -> None:
    errors = errors_of("""\
        models:
          m:
            cmd: ${env.SERVER} --port ${PORT}
            env: ["TOKEN=${env.TOKEN}"]
        """)
    assert errors == [
        "config.yaml:3: environment variable 'SERVER' is not set; export it or remove ${env.SERVER}",
        "config.yaml:4: environment variable 'TOKEN' is not set; export it or remove ${env.TOKEN}",
    ]


def test_env_value_with_a_newline_is_refused() -> None:
    error = one_error("apiKeys: ['${env.KEY}']\n", {"KEY": "a\nb"})
    assert error.startswith("config.yaml:1: environment variable 'KEY' contains newlines")


def test_env_inside_a_block_scalar_is_substituted() -> None:
    config = load(
        """\
        models:
          m:
            cmd: |
              ${env.BIN}
              --port ${PORT}
        """,
        {"BIN": "/usr/bin/server"},
    )
    assert config.models["m"].cmd == ("/usr/bin/server", "--port", "5800")


def test_environ_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSWAP_TEST_SERVER", "/bin/from-env")
    config = load_config_text("models:\n  m:\n    cmd: ${env.LLMSWAP_TEST_SERVER} --port ${PORT}\n")
    assert config.models["m"].cmd[0] == "/bin/from-env"


def test_config_error_lists_every_problem_in_file_order() -> None:
    with pytest.raises(ConfigError) as caught:
        load("""\
            globalTTL: -1
            models:
              b:
                cmd: srv --port ${PORT}
                ttl: -7
              a:
                ttl: 1
            logToStdout: everywhere
            """)
    lines = [int(error.split(":")[1]) for error in caught.value.errors]
    assert lines == sorted(lines)
    assert len(caught.value.errors) == 4
    assert caught.value.problems[0].path == "globalTTL"
    assert str(caught.value).count("\n") == 3


def test_load_config_reads_the_file_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "swap.yaml"
    path.write_text("models:\n  m:\n    cmd: srv --port ${PORT}\n    ttl: -9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert caught.value.errors[0].startswith(f"{path}:4: models.m.ttl: ")


def test_load_config_sets_path_and_state_dir_beside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "swap.yaml"
    path.write_text("\ufeffmodels:\n  m:\n    cmd: srv --port ${PORT}\n")
    config = load_config(str(path), environ={})
    assert config.path == path
    assert config.state_dir == tmp_path / ".llmswap-state"


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "absent.yaml")
    assert caught.value.errors == (
        f"{tmp_path / 'absent.yaml'}: cannot read the config file: No such file or directory; check the path",
    )


def test_non_utf8_file_is_a_config_error_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"models: {}\nname: caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.errors == (f"{path}:2: the file is not UTF-8 text; save it as UTF-8",)
