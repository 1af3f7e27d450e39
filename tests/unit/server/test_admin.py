"""The bodies of `/v1/models` and `/running`, built from config and process state (no event loop)."""

from dataclasses import dataclass
from types import MappingProxyType

from llmswap.config.model import Capabilities, Config, ModelConfig, PeerConfig
from llmswap.process.state import ProcessState
from llmswap.scheduler.types import QueueSnapshot
from llmswap.server.admin.models import model_records, running_entries
from llmswap.server.observe.records import render_capabilities

CREATED = 1_700_000_000


def model(model_id: str, **fields) -> ModelConfig:
    return ModelConfig(id=model_id, cmd=("serve", model_id), proxy="http://127.0.0.1:1", **fields)


def config(*models: ModelConfig, **fields) -> Config:
    aliases = {alias: m.id for m in models for alias in m.aliases}
    return Config(models={m.id: m for m in models}, aliases=aliases, **fields)


def test_local_model_record_has_llama_swap_shape():
    cfg = config(model("m1", name=" Model One ", description="first", aliases=("a1",),
                       metadata=MappingProxyType({"family": "qwen", "tags": ("x", "y")})))
    [record] = model_records(cfg, {}, CREATED)
    assert record == {
        "id": "m1", "object": "model", "created": CREATED, "owned_by": "llmswap",
        "name": "Model One", "description": "first",
        "meta": {"llamaswap": {"family": "qwen", "tags": ["x", "y"], "type": "model", "aliases": ["a1"]}},
        "status": {"value": "unloaded"},
    }


def test_empty_name_and_description_are_omitted_and_aliases_only_when_present():
    [record] = model_records(config(model("m")), {}, CREATED)
    assert "name" not in record and "description" not in record
    assert record["meta"] == {"llamaswap": {"type": "model"}}


def test_status_is_loaded_for_every_running_state():
    cfg = config(model("a"), model("b"), model("c"), model("d"))
    running = {"a": ProcessState.STARTING, "b": ProcessState.READY, "c": ProcessState.STOPPING}
    status = {r["id"]: r["status"]["value"] for r in model_records(cfg, running, CREATED)}
    assert status == {"a": "loaded", "b": "loaded", "c": "loaded", "d": "unloaded"}


def test_unlisted_models_are_hidden_with_their_aliases():
    cfg = config(model("shown"), model("hidden", unlisted=True, aliases=("h",)), include_aliases_in_list=True)
    assert [r["id"] for r in model_records(cfg, {}, CREATED)] == ["shown"]


def test_aliases_are_listed_when_asked():
    cfg = config(model("m", name="M", aliases=("b-alias", "a-alias"), metadata=MappingProxyType({"k": 1})),
                 include_aliases_in_list=True)
    records = model_records(cfg, {"m": ProcessState.READY}, CREATED)
    assert [r["id"] for r in records] == ["a-alias", "b-alias", "m"]
    alias = records[0]
    assert alias["name"] == "M"
    assert alias["status"] == {"value": "loaded"}
    assert alias["meta"]["llamaswap"] == {"k": 1, "type": "alias", "modelID": "m"}


def test_aliases_are_not_listed_by_default():
    assert [r["id"] for r in model_records(config(model("m", aliases=("a",))), {}, CREATED)] == ["m"]


def test_peer_models_are_listed_qualified_and_unloaded():
    cfg = config(model("local"), peers={"cloud": PeerConfig("cloud", "https://x", models=("gpt", "llama"))})
    records = model_records(cfg, {}, CREATED)
    assert [r["id"] for r in records] == ["cloud/gpt", "cloud/llama", "local"]
    assert records[0] == {
        "id": "cloud/gpt", "object": "model", "created": CREATED, "owned_by": "llmswap", "name": "cloud: gpt",
        "meta": {"llamaswap": {"type": "peer", "peerID": "cloud"}}, "status": {"value": "unloaded"},
    }


def test_capabilities_render_openrouter_style_keys():
    caps = Capabilities(input=("text", "image"), output=("text",), tools=True, context=8192)
    assert render_capabilities(caps) == {
        "architecture": {"input_modalities": ["text", "image"], "output_modalities": ["text"],
                         "modality": "text+image->text"},
        "capabilities": {"vision": True, "function_calling": True},
        "supported_parameters": ["tools", "tool_choice"],
        "context_length": 8192,
    }


def test_capabilities_for_speech_images_and_rerankers():
    assert render_capabilities(Capabilities(input=("audio",), output=("text",)))["capabilities"] == {
        "audio_transcriptions": True}
    assert render_capabilities(Capabilities(input=("text",), output=("audio",)))["capabilities"] == {
        "audio_speech": True}
    assert render_capabilities(Capabilities(input=("text", "image"), output=("image",)))["capabilities"] == {
        "vision": True, "image_generation": True, "image_to_image": True}
    assert render_capabilities(Capabilities(reranker=True)) == {"capabilities": {"reranker": True}}
    assert render_capabilities(Capabilities()) == {}


def test_capabilities_win_over_metadata_keys_and_set_n_ctx():
    cfg = config(model("m", capabilities=Capabilities(context=4096),
                       metadata=MappingProxyType({"context_length": 1, "architecture": "x", "other": 2})))
    [record] = model_records(cfg, {}, CREATED)
    assert record["context_length"] == 4096
    assert record["meta"] == {"llamaswap": {"other": 2, "type": "model"}, "n_ctx": 4096}


@dataclass
class StubProcess:
    config: ModelConfig
    state: ProcessState
    pid: int | None = None
    last_start_duration: float | None = None


def test_running_lists_live_processes_sorted_with_llmswap_extras():
    processes = {
        "zeta": StubProcess(model("zeta", cmd_text="serve zeta", ttl=300.0, name="Z", description="last"),
                            ProcessState.READY, pid=4242, last_start_duration=1.23456),
        "alpha": StubProcess(model("alpha", ttl=2.5), ProcessState.STARTING, pid=17),
        "off": StubProcess(model("off"), ProcessState.STOPPED),
        "gone": StubProcess(model("gone"), ProcessState.SHUTDOWN),
    }
    snapshot = QueueSnapshot(waiting={"alpha": 3}, in_flight={"zeta": 2})
    assert running_entries(processes, snapshot) == [
        {"model": "alpha", "state": "starting", "cmd": "", "proxy": "http://127.0.0.1:1", "ttl": 2.5,
         "name": "", "description": "", "pid": 17, "in_flight": 0, "waiting": 3, "last_start_seconds": None},
        {"model": "zeta", "state": "ready", "cmd": "serve zeta", "proxy": "http://127.0.0.1:1", "ttl": 300,
         "name": "Z", "description": "last", "pid": 4242, "in_flight": 2, "waiting": 0,
         "last_start_seconds": 1.235},
    ]


def test_running_is_empty_when_nothing_runs():
    assert running_entries({"m": StubProcess(model("m"), ProcessState.STOPPED)}, QueueSnapshot()) == []
