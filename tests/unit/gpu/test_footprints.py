"""FootprintBook: declared floors, learned peaks, the conservative default, and the state file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from llmswap.config.model import Config, ModelConfig
from llmswap.machine import FOOTPRINTS_FILE, Footprint, FootprintBook, GiB, MiB

BUDGETS = {0: 24 * GiB, 1: 24 * GiB}


def model(id: str, vram: int | None = None, gpus: tuple[int, ...] | None = None) -> ModelConfig:
    return ModelConfig(id=id, cmd=("serve", id), vram=vram, gpus=gpus)


def book_of(*models: ModelConfig, path: Path | None = None, budgets=BUDGETS) -> FootprintBook:
    book = FootprintBook({m.id: m for m in models}, budgets, path=path)
    book.load()
    return book


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_declared_footprint_is_split_evenly_over_pinned_devices() -> None:
    book = book_of(model("a", vram=10 * GiB + 1, gpus=(0, 1)), model("b", vram=6 * GiB, gpus=(1,)))
    assert book.footprint_of("a") == Footprint(
        "a", 10 * GiB + 1, {0: 5 * GiB + 1, 1: 5 * GiB}, "declared", 10 * GiB + 1, None
    )
    assert book.footprint_of("b").per_device == {1: 6 * GiB}


def test_unpinned_model_lives_on_every_budgeted_device() -> None:
    book = book_of(model("a", vram=8 * GiB))
    assert book.devices_of("a") == (0, 1)
    assert book.footprint_of("a").per_device == {0: 4 * GiB, 1: 4 * GiB}


def test_learned_footprint_above_the_declared_one_raises_it_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmswap")
    book = book_of(model("qwen", vram=int(6.5 * GiB), gpus=(0,)))
    assert book.observe("qwen", {0: 7 * GiB}) is True
    fp = book.footprint_of("qwen")
    assert (fp.total, fp.source, fp.declared, fp.learned) == (7 * GiB, "learned", int(6.5 * GiB), 7 * GiB)
    assert fp.per_device == {0: 7 * GiB}
    [warning] = messages(caplog, logging.WARNING)
    assert "qwen measured 7.0 GiB, above its declared vram 6.5 GiB" in warning
    assert "set models.qwen.vram to at least 7.0 GiB" in warning


def test_warning_comes_once_per_new_peak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llmswap")
    book = book_of(model("qwen", vram=6 * GiB, gpus=(0,)))
    assert book.observe("qwen", {0: 7 * GiB}) is True
    assert book.observe("qwen", {0: 7 * GiB}) is False  # the same peak again
    assert book.observe("qwen", {0: 6 * GiB + 512 * MiB}) is False  # lower: the peak stays
    assert book.observe("qwen", {0: 8 * GiB}) is True
    assert len(messages(caplog, logging.WARNING)) == 2
    assert book.footprint("qwen") == 8 * GiB


def test_learned_footprint_below_the_declared_one_does_not_lower_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llmswap")
    book = book_of(model("a", vram=12 * GiB, gpus=(0, 1)))
    book.observe("a", {0: 6 * GiB, 1: 2 * GiB})
    fp = book.footprint_of("a")
    assert (fp.total, fp.source, fp.learned) == (12 * GiB, "declared", 8 * GiB)
    # Where it was measured keeps its shape, scaled up to the declared floor.
    assert fp.per_device == {0: 9 * GiB, 1: 3 * GiB}
    assert messages(caplog, logging.WARNING) == []


def test_undeclared_model_uses_its_learned_footprint() -> None:
    book = book_of(model("a"))
    book.observe("a", {1: 3 * GiB})
    assert book.footprint_of("a") == Footprint("a", 3 * GiB, {1: 3 * GiB}, "learned", None, 3 * GiB)


def test_readings_of_nothing_teach_nothing() -> None:
    book = book_of(model("a", vram=2 * GiB))
    assert book.observe("a", {}) is False
    assert book.observe("a", {0: 0}) is False
    assert book.learned("a") == {}


def test_unknown_size_defaults_to_the_whole_budget_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llmswap")
    book = book_of(model("mystery", gpus=(1,)), model("known", vram=1 * GiB))
    fp = book.footprint_of("mystery")
    assert (fp.total, fp.per_device, fp.source) == (24 * GiB, {1: 24 * GiB}, "default")
    book.load()  # loading again does not repeat it
    [warning] = messages(caplog, logging.WARNING)
    assert "model mystery has no declared vram and has not been measured yet" in warning
    assert "24.0 GiB" in warning and "set models.mystery.vram" in warning


def test_reading_a_footprint_never_logs(caplog: pytest.LogCaptureFixture) -> None:
    book = book_of(model("a"), model("b", vram=1 * GiB))
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    for name in ("a", "b", "unknown"):
        book.footprint_of(name)
    assert caplog.records == []


def test_state_round_trip_keeps_learned_values_and_load_times(tmp_path: Path) -> None:
    path = tmp_path / "state" / FOOTPRINTS_FILE
    models = (model("a", vram=4 * GiB), model("b"))
    book = book_of(*models, path=path)
    book.observe("a", {0: 5 * GiB, 1: 1 * GiB})
    book.record_load_time("a", 12.5)
    book.record_load_time("b", 2.0)
    book.mark_used("a", 100.0)
    assert book.save() is True
    assert [p.name for p in path.parent.iterdir()] == [FOOTPRINTS_FILE]  # no temporary left behind

    again = book_of(*models, path=path)
    assert again.learned("a") == {0: 5 * GiB, 1: 1 * GiB}
    assert again.footprint("a") == 6 * GiB
    assert again.load_time("a") == 12.5
    assert again.load_time("b") == 2.0
    assert again.learned("b") == {}
    assert again.last_used("a") is None  # a clock reading from another run means nothing


def test_state_file_is_versioned_json(tmp_path: Path) -> None:
    path = tmp_path / FOOTPRINTS_FILE
    book = book_of(model("a"), path=path)
    book.observe("a", {0: 3 * GiB})
    book.save()
    assert json.loads(path.read_text()) == {"version": 1, "models": {"a": {"learned": {"0": 3 * GiB}}}}


def test_models_absent_from_the_config_survive_a_save(tmp_path: Path) -> None:
    path = tmp_path / FOOTPRINTS_FILE
    first = book_of(model("a"), model("b"), path=path)
    first.observe("b", {0: 2 * GiB})
    first.record_load_time("b", 3.0)
    first.save()

    without_b = book_of(model("a"), path=path)
    without_b.observe("a", {0: 1 * GiB})
    without_b.save()

    with_b = book_of(model("a"), model("b"), path=path)
    assert with_b.learned("b") == {0: 2 * GiB}
    assert with_b.load_time("b") == 3.0
    assert with_b.learned("a") == {0: 1 * GiB}


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"version": 99, "models": {}}',
        '{"version": 1, "models": {"a": {"learned": {"gpu0": 5}}}}',
        '{"version": 1, "models": {"a": {"learned": {"0": -5}}}}',
        '{"version": 1, "models": {"a": {"load_time": "slow"}}}',
    ],
    ids=["syntax", "not-an-object", "version", "device-key", "negative-bytes", "load-time"],
)
def test_corrupt_state_file_starts_empty_with_a_warning(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmswap")
    path = tmp_path / FOOTPRINTS_FILE
    path.write_text(content)
    book = book_of(model("a", vram=1 * GiB), path=path)
    assert book.learned("a") == {} and book.load_time("a") is None
    [warning] = messages(caplog, logging.WARNING)
    assert str(path) in warning and "starting empty" in warning

    book.observe("a", {0: 2 * GiB})
    assert book.save() is True  # the next save replaces the corrupt file
    assert book_of(model("a", vram=1 * GiB), path=path).learned("a") == {0: 2 * GiB}


def test_missing_state_file_starts_empty_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmswap")
    book = book_of(model("a", vram=1 * GiB), path=tmp_path / FOOTPRINTS_FILE)
    assert book.learned("a") == {}
    assert messages(caplog, logging.WARNING) == []
    assert any("no learned footprints" in m for m in messages(caplog, logging.INFO))


def test_save_failure_is_a_warning_not_a_crash(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llmswap")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    book = book_of(model("a"), path=blocker / FOOTPRINTS_FILE)
    book.observe("a", {0: 1 * GiB})
    assert book.save() is False
    [warning] = messages(caplog, logging.WARNING)[-1:]
    assert "cannot save learned footprints" in warning and "stateDir" in warning


def test_for_config_persists_under_state_dir_or_nowhere(tmp_path: Path) -> None:
    models = {"a": model("a")}
    book = FootprintBook.for_config(Config(models=models, state_dir=tmp_path), BUDGETS)
    assert book.path == tmp_path / FOOTPRINTS_FILE
    book.observe("a", {0: 1 * GiB})
    assert book.save() is True and book.path.exists()

    in_memory = FootprintBook.for_config(Config(models=models), BUDGETS)
    assert in_memory.path is None
    assert in_memory.save() is False


def test_forget_drops_what_was_learned() -> None:
    book = book_of(model("a", vram=1 * GiB))
    book.observe("a", {0: 3 * GiB})
    book.record_load_time("a", 9.0)
    book.forget("a")
    assert book.footprint("a") == 1 * GiB and book.load_time("a") is None
