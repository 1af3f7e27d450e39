"""`--config` merged with `--config-dir`: llama-swap's merge rules, and errors naming both files and lines."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from llmswap.config import ConfigError, ConfigSources
from llmswap.config.errors import Problems, Source
from llmswap.config.merge import merge_trees, renumber
from llmswap.config.yamltree import Map, Scalar, Seq, parse_document, to_python

MODEL = "{cmd: 'srv --port ${PORT}'}"


def merged(*texts: str) -> tuple[Map, Problems]:
    """The pure merge of these documents, named a.yaml, b.yaml, ... and numbered across files."""
    trees, sources, next_line = [], [], 1
    for index, text in enumerate(texts):
        text = textwrap.dedent(text)
        tree = parse_document(text, Problems("unused"))
        renumber(tree, next_line - 1)
        trees.append(tree)
        sources.append(Source(f"{'abcdef'[index]}.yaml", next_line))
        next_line += text.count("\n") + 1
    problems = Problems("a.yaml", sources=tuple(sources))
    return merge_trees(trees, problems), problems


def errors(*texts: str) -> list[str]:
    _, problems = merged(*texts)
    return [str(problem) for problem in problems.errors]


def test_mappings_merge_key_by_key() -> None:
    tree, problems = merged("macros:\n  a: 1\nrouting:\n  router: {use: group}\n",
                            "macros:\n  b: two\nrouting:\n  scheduler: {use: fifo}\n")
    assert problems.errors == []
    assert to_python(tree) == {"macros": {"a": 1, "b": "two"},
                               "routing": {"router": {"use": "group"}, "scheduler": {"use": "fifo"}}}


def test_lists_concatenate_in_file_order() -> None:
    tree, _ = merged("apiKeys: [k1, k2]\n", "apiKeys: [k3]\n", "apiKeys:\n  - k4\n")
    assert to_python(tree)["apiKeys"] == ["k1", "k2", "k3", "k4"]


def test_equal_values_agree_and_null_yields() -> None:
    tree, problems = merged("globalTTL: 100\nlogLevel:\n", "globalTTL: 100\nlogLevel: debug\n",
                            "logLevel: ~\n")
    assert problems.errors == []
    assert to_python(tree) == {"globalTTL": 100, "logLevel": "debug"}


def test_a_value_set_differently_names_both_files_and_lines() -> None:
    assert errors("logLevel: info\nglobalTTL: 100\n", "# second\n\nglobalTTL: 200\n") == [
        "b.yaml:3: globalTTL: conflicts with a.yaml:2: 200 here, 100 there; set it in one file only "
        "(across files, mappings merge and lists join, other values must be equal)"
    ]


def test_same_text_of_another_type_is_a_conflict() -> None:
    assert errors("startPort: 5800\n", "startPort: '5800'\n") == [
        'b.yaml:1: startPort: conflicts with a.yaml:1: "5800" here, 5800 there; set it in one file only '
        "(across files, mappings merge and lists join, other values must be equal)"
    ]


def test_a_list_against_a_mapping_is_a_conflict() -> None:
    (error,) = errors("upstream:\n  ignorePaths: [x]\n", "upstream:\n  ignorePaths: {a: b}\n")
    assert error.startswith("b.yaml:2: upstream.ignorePaths: conflicts with a.yaml:2: a mapping here, "
                            "a list there;")


def test_a_model_defined_in_two_files_names_both() -> None:
    assert errors(f"models:\n  qwen: {MODEL}\n", f"models:\n  llama: {MODEL}\n  qwen: {MODEL}\n") == [
        "b.yaml:3: models.qwen: models entry 'qwen' is already defined at a.yaml:2; define it in one file "
        "only (entries of this section are not merged)"
    ]


@pytest.mark.parametrize("section", ["groups", "profiles", "selectors", "peers", "matrix"])
def test_every_entity_section_refuses_a_repeated_entry(section: str) -> None:
    (error,) = errors(f"{section}:\n  x: {{a: 1}}\n", f"{section}:\n  y: {{a: 1}}\n  x: {{a: 1}}\n")
    assert error.startswith(f"b.yaml:3: {section}.x: {section} entry 'x' is already defined at a.yaml:2;")


def test_router_groups_are_entities_but_the_router_merges() -> None:
    first = "routing:\n  router:\n    use: group\n    settings:\n      groups:\n        g1: {members: [a]}\n"
    second = "routing:\n  router:\n    settings:\n      groups:\n        g2: {members: [b]}\n"
    tree, problems = merged(first, second)
    assert problems.errors == []
    assert set(to_python(tree)["routing"]["router"]["settings"]["groups"]) == {"g1", "g2"}
    (error,) = errors(first, second.replace("g2", "g1"))
    assert error.startswith("b.yaml:5: routing.router.settings.groups.g1: routing.router.settings.groups "
                            "entry 'g1' is already defined at a.yaml:6;")


def test_entities_merged_from_files_keep_their_own_lines() -> None:
    tree, problems = merged(f"models:\n  a: {MODEL}\n", f"\n\nmodels:\n  b: {MODEL}\n")
    entry = tree.get("models")
    assert isinstance(entry, Map)
    assert problems.locate(entry.entries["b"].key_line) == ("b.yaml", 4)
    assert problems.locate(entry.entries["a"].key_line) == ("a.yaml", 2)


def test_renumber_shifts_every_line_once() -> None:
    tree = parse_document("a:\n  - 1\n  - {b: 2}\n", Problems("x.yaml"))
    renumber(tree, 10)
    seq = tree.get("a")
    assert isinstance(seq, Seq) and tree.entries["a"].key_line == 11
    assert [item.line for item in seq.items] == [12, 13]
    inner = seq.items[1]
    assert isinstance(inner, Map) and isinstance(inner.get("b"), Scalar) and inner.entries["b"].key_line == 13


# ---------------------------------------------------------------- files on disk: ConfigSources


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def load_errors(sources: ConfigSources) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        sources.load(environ={})
    return list(caught.value.errors)


def test_directory_files_merge_after_the_config_file_in_name_order(tmp_path: Path) -> None:
    main = write(tmp_path / "config.yaml",
                 f"startPort: 7000\napiKeys: [main-key]\nmodels:\n  zeta: {MODEL}\n")
    write(tmp_path / "conf.d" / "20-b.yml", f"apiKeys: [b-key]\nmodels:\n  beta: {MODEL}\n")
    write(tmp_path / "conf.d" / "10-a.yaml", f"apiKeys: [a-key]\nmodels:\n  alpha: {MODEL}\n")
    write(tmp_path / "conf.d" / "notes.txt", "not: yaml: at all")
    write(tmp_path / "conf.d" / "sub" / "ignored.yaml", f"models:\n  sub: {MODEL}\n")
    write(tmp_path / "conf.d" / "30-empty.yaml", "# nothing here yet\n")
    config = ConfigSources(main, tmp_path / "conf.d").load(environ={})
    assert [key.key for key in config.api_keys] == ["main-key", "a-key", "b-key"]
    assert list(config.models) == ["zeta", "alpha", "beta"]
    # ${PORT}s go by sorted model id across all files, as from one file.
    assert {m: c.proxy for m, c in config.models.items()} == {
        "alpha": "http://localhost:7000", "beta": "http://localhost:7001", "zeta": "http://localhost:7002"}


def test_a_directory_alone_is_a_config(tmp_path: Path) -> None:
    write(tmp_path / "d" / "a.yaml", f"models:\n  a: {MODEL}\n")
    config = ConfigSources(directory=tmp_path / "d").load(environ={})
    assert list(config.models) == ["a"]
    assert config.state_dir == tmp_path / "d" / ".llmswap-state"


def test_a_mistake_in_a_directory_file_names_that_file_and_line(tmp_path: Path) -> None:
    main = write(tmp_path / "config.yaml", "# main\n" * 5 + f"models:\n  a: {MODEL}\n")
    other = write(tmp_path / "d" / "b.yaml", "models:\n  b:\n    cmd: srv --port ${PORT}\n    ttl: soon\n")
    (error,) = load_errors(ConfigSources(main, tmp_path / "d"))
    assert error.startswith(f"{other}:4: models.b.ttl: ")


def test_an_alias_taken_in_another_file_names_it(tmp_path: Path) -> None:
    main = write(tmp_path / "config.yaml", "models:\n  a: {cmd: 'srv --port ${PORT}', aliases: [fast]}\n")
    other = write(tmp_path / "d" / "b.yaml", "models:\n  b: {cmd: 'srv --port ${PORT}', aliases: [fast]}\n")
    (error,) = load_errors(ConfigSources(main, tmp_path / "d"))
    assert error.startswith(f"{other}:2: models.b.aliases[0]: duplicate alias fast")
    assert f"(already an alias of a at {main}:2)" in error


def test_yaml_and_env_errors_of_every_file_are_listed(tmp_path: Path) -> None:
    main = write(tmp_path / "config.yaml", "models:\n  a: [unclosed\n")
    other = write(tmp_path / "d" / "b.yaml", "\napiKeys: ['${env.MISSING_KEY}']\n")
    first, second = load_errors(ConfigSources(main, tmp_path / "d"))
    assert first.startswith(f"{main}:") and "invalid YAML" in first
    assert second.startswith(f"{other}:2: environment variable 'MISSING_KEY' is not set")


def test_the_config_file_inside_the_directory_is_refused(tmp_path: Path) -> None:
    main = write(tmp_path / "d" / "config.yaml", f"models:\n  a: {MODEL}\n")
    assert load_errors(ConfigSources(main, tmp_path / "d")) == [
        f"{main}: is also in --config-dir {tmp_path / 'd'}; give it only once (remove it from one of the two)"
    ]


def test_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    (error,) = load_errors(ConfigSources(directory=tmp_path / "nowhere"))
    assert error == (f"{tmp_path / 'nowhere'}: cannot read the config directory: No such file or directory; "
                     "check the --config-dir path")


def test_an_empty_directory_alone_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert load_errors(ConfigSources(directory=tmp_path / "d")) == [
        f"{tmp_path / 'd'}: no configuration sources found: the directory has no *.yaml or *.yml file; "
        "add one or give --config"
    ]


def test_sources_need_a_file_or_a_directory() -> None:
    with pytest.raises(ValueError):
        ConfigSources()
