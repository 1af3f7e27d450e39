"""Macros (order, scope, types, names) and `${PORT}` assignment."""

from __future__ import annotations

import shlex
import sys

import pytest

from llmswap.config import macros
from llmswap.config.macros import go_text

from .support import errors_of, load, one_error


def test_macro_in_macro_uses_macros_declared_before_it() -> None:
    config = load("""\
        macros:
          base: /models
          path: ${base}/llama
          full: ${path}/m.gguf
        models:
          m:
            cmd: load ${full} --port ${PORT}
        """)
    assert config.models["m"].cmd == ("load", "/models/llama/m.gguf", "--port", "5800")


def test_macro_using_one_declared_later_is_unknown() -> None:
    error = one_error("""\
        macros:
          full: ${path}/m.gguf
          path: /models
        models:
          m:
            cmd: load ${full} --port ${PORT}
        """)
    assert error == (
        "config.yaml:6: models.m.cmd: unknown macro '${path}'; declare it under macros: "
        "(a macro may only use macros declared before it)"
    )


def test_model_macro_replaces_the_global_in_place() -> None:
    config = load("""\
        macros:
          tag: global-level
          msg: value-${tag}
        models:
          m:
            macros:
              tag: model-level
            cmd: echo ${msg} --port ${PORT}
          other:
            cmd: echo ${msg} --port ${PORT}
        """)
    assert config.models["m"].cmd[1] == "value-model-level"
    assert config.models["other"].cmd[1] == "value-global-level"


def test_model_macros_do_not_leak_to_other_models() -> None:
    error = one_error("""\
        models:
          one:
            macros:
              LOCAL: x
            cmd: srv ${LOCAL} --port ${PORT}
          other:
            cmd: srv ${LOCAL} --port ${PORT}
        """)
    assert error.startswith("config.yaml:7: models.other.cmd: unknown macro '${LOCAL}'")


def test_model_id_is_usable_inside_global_macros() -> None:
    config = load("""\
        macros:
          args: --alias ${MODEL_ID}
        models:
          qwen:
            cmd: srv ${args} --port ${PORT}
        """)
    assert config.models["qwen"].cmd == ("srv", "--alias", "qwen", "--port", "5800")


def test_model_id_outside_models_is_an_error() -> None:
    error = one_error("apiKeys: ['${MODEL_ID}']\n")
    assert error == "config.yaml:1: apiKeys[0]: ${MODEL_ID} is only available inside a model's settings"


def test_python_is_the_interpreter_running_llmswap_inside_global_macros() -> None:
    config = load("""\
        macros:
          demo: ${PYTHON} -m llmswap.demo --port ${PORT}
        models:
          small:
            cmd: ${demo} --model-name ${MODEL_ID}
        """)
    assert config.models["small"].cmd == (sys.executable, "-m", "llmswap.demo", "--port", "5800",
                                          "--model-name", "small")


def test_python_with_a_space_in_its_path_stays_one_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(macros, "PYTHON_COMMAND", shlex.quote("/opt/my env/bin/python"))
    config = load("models:\n  m:\n    cmd: ${PYTHON} -m srv --port ${PORT}\n")
    assert config.models["m"].cmd == ("/opt/my env/bin/python", "-m", "srv", "--port", "5800")


def test_a_macro_named_python_in_the_config_replaces_the_builtin() -> None:
    config = load("""\
        macros:
          PYTHON: /usr/bin/python3.12
        models:
          a:
            cmd: ${PYTHON} -m srv --port ${PORT}
          b:
            macros:
              PYTHON: pypy3
            cmd: ${PYTHON} -m srv --port ${PORT}
        """)
    assert config.models["a"].cmd[0] == "/usr/bin/python3.12"
    assert config.models["b"].cmd[0] == "pypy3"


def test_python_outside_models_is_an_error() -> None:
    error = one_error("apiKeys: ['${PYTHON}']\n")
    assert error == "config.yaml:1: apiKeys[0]: ${PYTHON} is only available inside a model's settings"


def test_global_macros_apply_to_top_level_values_with_types() -> None:
    config = load("""\
        macros:
          first-port: 9000
          key: sk-abc
        startPort: ${first-port}
        apiKeys: ["${key}"]
        peers:
          p:
            proxy: http://peer:${first-port}
            apiKey: ${key}
            models: [x]
        models:
          m:
            cmd: srv --port ${PORT}
        """)
    assert config.start_port == 9000
    assert config.models["m"].port == 9000
    assert config.api_keys[0].key == "sk-abc"
    assert (config.peers["p"].proxy, config.peers["p"].api_key) == ("http://peer:9000", "sk-abc")


def test_exact_macro_value_keeps_its_type_and_interpolation_uses_go_formatting() -> None:
    config = load("""\
        macros:
          ctx: 4096
          temp: 0.7
          think: true
          big: 1.0e+20
        models:
          m:
            cmd: srv --ctx ${ctx} --temp ${temp} --port ${PORT}
            metadata:
              ctx: ${ctx}
              temp: "${temp}"
              think: ${think}
              text: "t=${temp} think=${think} big=${big}"
              port: ${PORT}
              nested: ["${ctx}", {id: "${MODEL_ID}"}]
        """)
    model = config.models["m"]
    assert model.cmd == ("srv", "--ctx", "4096", "--temp", "0.7", "--port", "5800")
    assert model.metadata == {
        "ctx": 4096,
        "temp": 0.7,
        "think": True,
        "text": "t=0.7 think=true big=100000000000000000000",
        "port": 5800,
        "nested": [4096, {"id": "m"}],
    }


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (4096, "4096"),
        (4096.0, "4096"),
        (0.7, "0.7"),
        (1e21, "1e+21"),
        (1e-05, "1e-05"),
        ("x", "x"),
    ],
)
def test_go_text_matches_go_percent_v(value: object, text: str) -> None:
    assert go_text(value) == text


@pytest.mark.parametrize("name", ["PORT", "MODEL_ID", "PID", "KV_DIR"])
def test_reserved_macro_names_are_errors(name: str) -> None:
    error = one_error(f"macros:\n  {name}: 1\n")
    assert error == (
        f"config.yaml:2: macros.{name}: macro name '{name}' is reserved; choose another name (PID, PORT, "
        "MODEL_ID, KV_DIR)"
    )


def test_reserved_names_are_errors_in_model_macros_too() -> None:
    error = one_error("""\
        models:
          m:
            macros:
              PORT: 80
            cmd: srv --port ${PORT}
        """)
    assert error.startswith("config.yaml:4: models.m.macros.PORT: macro name 'PORT' is reserved")


def test_macro_name_rules() -> None:
    long_name = "a" * 64
    errors = errors_of(f"""\
        macros:
          "bad name": 1
          {long_name}: 2
          ok_name-1: 3
        """)
    assert errors == [
        "config.yaml:2: macros.bad name: macro name 'bad name' contains invalid characters, "
        "must match pattern ^[a-zA-Z0-9_-]+$",
        f"config.yaml:3: macros.{long_name}: macro name '{long_name}' exceeds maximum length of 63 "
        "characters",
    ]


def test_macro_self_reference_is_an_error() -> None:
    error = one_error("macros:\n  loop: a-${loop}\n")
    assert error == "config.yaml:2: macros.loop: macro 'loop' contains self-reference"


@pytest.mark.parametrize(("value", "shown"), [("[1, 2]", "a list"), ("{a: 1}", "a mapping"), ("", "null")])
def test_macro_values_must_be_scalars(value: str, shown: str) -> None:
    error = one_error(f"macros:\n  m: {value}\n")
    assert error == (
        f"config.yaml:2: macros.m: macro 'm' has invalid type ({shown}), "
        "must be a scalar type (string, int, float, or bool)"
    )


def test_macros_must_be_a_mapping() -> None:
    error = one_error("macros: [a, b]\n")
    assert error == "config.yaml:1: macros: must be a mapping of macro names to values, got a list"


def test_unknown_macro_anywhere_in_a_model_names_the_key_and_line() -> None:
    errors = errors_of("""\
        models:
          m:
            cmd: srv --port ${PORT}
            metadata:
              deep:
                - ok
                - "${missing}"
            filters:
              setParamsByID:
                "${nope}:x": {a: 1}
        """)
    assert errors == [
        "config.yaml:7: models.m.metadata.deep[1]: unknown macro '${missing}'; declare it under macros: "
        "(a macro may only use macros declared before it)",
        "config.yaml:10: models.m.filters.setParamsByID.${nope}:x: unknown macro '${nope}'; declare it under "
        "macros: (a macro may only use macros declared before it)",
    ]


def test_pid_is_kept_in_cmd_stop_and_refused_elsewhere() -> None:
    config = load("""\
        models:
          m:
            cmd: srv --port ${PORT}
            cmdStop: kill -TERM ${PID}
        """)
    assert config.models["m"].cmd_stop == ("kill", "-TERM", "${PID}")
    error = one_error("""\
        models:
          m:
            cmd: srv --port ${PORT} --parent ${PID}
        """)
    assert error == (
        "config.yaml:3: models.m.cmd: ${PID} is only available in cmdStop (it is the upstream's process id "
        "at stop time)"
    )


def test_ports_follow_sorted_model_ids_and_skip_models_without_port() -> None:
    config = load("""\
        startPort: 5800
        models:
          model3:
            cmd: svr --port 1999
            proxy: http://localhost:1999
          model2:
            cmd: svr --port ${PORT}
          model1:
            cmd: svr --port ${PORT}
          a-first:
            cmd: svr --port ${PORT}
        """)
    ports = {model_id: model.port for model_id, model in config.models.items()}
    assert ports == {"model3": None, "model2": 5802, "model1": 5801, "a-first": 5800}
    assert config.models["model1"].proxy == "http://localhost:5801"
    assert config.models["model3"].proxy == "http://localhost:1999"
    assert list(config.models) == ["model3", "model2", "model1", "a-first"]


def test_port_reaches_every_field_of_its_model() -> None:
    config = load("""\
        models:
          m:
            cmd: svr --port ${PORT}
            proxy: http://127.0.0.1:${PORT}/base
            name: on ${PORT}
            env: ["PORT=${PORT}"]
            filters:
              setParamsByID:
                "m-${PORT}": {a: 1}
        """)
    model = config.models["m"]
    assert model.proxy == "http://127.0.0.1:5800/base"
    assert model.name == "on 5800"
    assert model.env == (("PORT", "5800"),)
    assert config.aliases == {"m-5800": "m"}


def test_proxy_using_port_without_cmd_using_it_is_an_error() -> None:
    error = one_error("""\
        models:
          fixed:
            cmd: svr --port 9000
        """)
    assert error == (
        "config.yaml:3: models.fixed.cmd: cmd does not pass --port ${PORT}, so llmswap cannot tell where "
        "the server listens (proxy, not set, defaults to http://localhost:${PORT}); add --port ${PORT} to "
        "cmd, or set proxy to the URL the server listens on (e.g. http://127.0.0.1:8080)"
    )
    error = one_error("""\
        models:
          fixed:
            cmd: svr --port 9000
            proxy: http://localhost:${PORT}
        """)
    assert error.startswith("config.yaml:4: models.fixed.proxy: proxy uses ${PORT} but cmd does not")


def test_port_used_elsewhere_without_cmd_using_it_is_an_error() -> None:
    error = one_error("""\
        models:
          fixed:
            cmd: svr --port 9000
            proxy: http://localhost:9000
            metadata: {port: "${PORT}"}
        """)
    assert error == (
        "config.yaml:5: models.fixed.metadata.port: ${PORT} is only available in a model whose cmd uses "
        "${PORT}"
    )


def test_commented_out_port_does_not_take_a_port() -> None:
    config = load("""\
        models:
          a:
            cmd: |
              svr --port 9000
              # --port ${PORT} ${macro-that-does-not-exist}
            proxy: http://localhost:9000
          b:
            cmd: svr --port ${PORT}
        """)
    assert (config.models["a"].port, config.models["b"].port) == (None, 5800)


def test_port_from_a_macro_counts_as_cmd_using_port() -> None:
    config = load("""\
        macros:
          server: >
            /bin/llama-server
            --port ${PORT}
        models:
          m:
            cmd: ${server} -m x.gguf
        """)
    assert config.models["m"].cmd == ("/bin/llama-server", "--port", "5800", "-m", "x.gguf")
    assert config.models["m"].port == 5800


def test_ports_running_past_65535_are_an_error() -> None:
    error = one_error("""\
        startPort: 65535
        models:
          a: {cmd: "svr --port ${PORT}"}
          b: {cmd: "svr --port ${PORT}"}
        """)
    assert error.startswith("config.yaml:4: models.b.cmd: no port left for ${PORT}")


def test_set_params_by_id_keys_expand_macros_but_mapping_keys_elsewhere_do_not() -> None:
    config = load("""\
        macros:
          suffix: high
        models:
          m:
            cmd: srv --port ${PORT}
            filters:
              setParamsByID:
                "${MODEL_ID}:${suffix}": {effort: "${suffix}"}
            metadata:
              "${suffix}": kept
        """)
    model = config.models["m"]
    assert model.filters.set_params_by_id == {"m:high": {"effort": "high"}}
    assert model.metadata == {"${suffix}": "kept"}
